package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats.go"
)

// nodeConfig is how an embcache process of the workload suite joins the
// cluster: what `embcache worker` does (cmd/embcache's nodeFlags.join),
// reduced to the settings the bench uses (no credentials, no payload token,
// degrade mode, the store's default budget). A copy until the library
// assembles a node itself (issue 16, item 2); keep the two in step.
type nodeConfig struct {
	natsURL       string
	node          string
	shmDir        string
	payloadListen string // httppull server address; empty: shm only (one machine)
	replicas      int
	leaseTTL      time.Duration
	storeTTL      time.Duration
}

// joined is a process's membership: its connection, payload plane and cache.
type joined struct {
	nc      *nats.Conn
	store   *shm.Store
	cache   *coordinator.Cache
	servers []*http.Server
}

// join connects, opens the payload plane and builds the cache.
func (f *nodeConfig) join(ctx context.Context, logger *slog.Logger, extra ...coordinator.Option) (*joined, error) {
	const mode = coordinator.ModeDegrade
	nc, err := coordinator.Connect(f.natsURL, mode)
	if err != nil {
		return nil, err
	}
	j := &joined{nc: nc}
	if j.store, err = shm.Open(f.shmDir, shm.WithNode(f.node)); err != nil {
		nc.Close()
		return nil, err
	}
	opts := []coordinator.Option{coordinator.WithNode(f.node), coordinator.WithShm(j.store), coordinator.WithMode(mode),
		coordinator.WithReplicas(f.replicas), coordinator.WithLeaseTTL(f.leaseTTL), coordinator.WithStoreTTL(f.storeTTL),
		coordinator.WithLogger(logger), coordinator.WithEvents(0)}
	if f.payloadListen != "" {
		l, err := net.Listen("tcp", f.payloadListen)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("payload listener: %w", err)
		}
		tr, err := httppull.NewTransport(f.node, "http://"+l.Addr().String(), j.store)
		if err != nil {
			l.Close()
			nc.Close()
			return nil, err
		}
		srv := &http.Server{Handler: httppull.NewServer(j.store, httppull.WithLogger(logger)), ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(l)
		j.servers = append(j.servers, srv)
		opts = append(opts, coordinator.WithTransport(payload.TransportHTTP, tr), coordinator.WithGetter(payload.TransportShm, j.store))
	} else {
		opts = append(opts, coordinator.WithTransport(payload.TransportShm, j.store))
	}
	if j.cache, err = coordinator.New(ctx, nc, append(opts, extra...)...); err != nil {
		j.close()
		return nil, err
	}
	return j, nil
}

func (j *joined) close() {
	if j.cache != nil {
		j.cache.Close()
	}
	for _, s := range j.servers {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s.Shutdown(ctx)
		cancel()
	}
	j.nc.Close()
}

// waitStoreReachable waits until c reaches the KV bucket (a copy of the
// agent's; coordinator has no such call yet).
func waitStoreReachable(ctx context.Context, c *coordinator.Cache, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for !c.Stats().StoreReachable {
		if time.Now().After(deadline) {
			return fmt.Errorf("store not reachable after %v", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
