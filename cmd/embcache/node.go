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
	"github.com/spf13/pflag"
)

// nodeFlags configure how a process joins the cluster.
type nodeFlags struct {
	natsURL       string
	user, pass    string
	node          string
	shmDir        string
	payloadListen string // httppull server address; empty: shm only (one machine)
	advertise     string // base URL others pull from
	token         string
	replicas      int
	leaseTTL      time.Duration
	storeTTL      time.Duration
	payloadSweep  time.Duration
	strict        bool
	shmMaxBytes   int64
}

func (f *nodeFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.natsURL, "nats", envOr("EMBCACHE_NATS", "nats://127.0.0.1:4222"), "NATS server URL(s), comma-separated ($EMBCACHE_NATS)")
	fs.StringVar(&f.user, "user", "", "NATS user")
	fs.StringVar(&f.pass, "password", envOr("EMBCACHE_NATS_PASSWORD", ""), "NATS password ($EMBCACHE_NATS_PASSWORD)")
	fs.StringVar(&f.node, "node", hostname(), "this node's name in leases and locations")
	fs.StringVar(&f.shmDir, "shm-dir", shm.DefaultDir, "shared-memory payload directory")
	fs.StringVar(&f.payloadListen, "payload-listen", "", "serve payloads over HTTP on this address (for other nodes)")
	fs.StringVar(&f.advertise, "advertise", "", "base URL other nodes pull payloads from (default http://<payload-listen>)")
	fs.StringVar(&f.token, "payload-token", envOr("EMBCACHE_PAYLOAD_TOKEN", ""), "bearer token for payload pulls ($EMBCACHE_PAYLOAD_TOKEN)")
	fs.IntVar(&f.replicas, "replicas", 1, "replicas of the bucket and stream when this process creates them")
	fs.DurationVar(&f.leaseTTL, "lease-ttl", 5*time.Second, "lease TTL")
	fs.DurationVar(&f.storeTTL, "store-ttl", time.Hour, "committed record TTL")
	fs.DurationVar(&f.payloadSweep, "payload-sweep", 0, "how often to remove shm files no committed record names (0: half the store TTL, 30s-10m; <0: never)")
	fs.BoolVar(&f.strict, "strict", false, "fail instead of computing locally when NATS is unreachable")
	fs.Int64Var(&f.shmMaxBytes, "shm-max-bytes", 0, "budget of the shm payload store in bytes (0: the store's default)")
}

func (f *nodeFlags) natsOptions() []nats.Option {
	if f.user != "" {
		return []nats.Option{nats.UserInfo(f.user, f.pass)}
	}
	return nil
}

// joined is a process's membership: its connection, payload plane and cache.
type joined struct {
	nc      *nats.Conn
	store   *shm.Store
	cache   *coordinator.Cache
	servers []*http.Server
	opts    []coordinator.Option
}

// join connects, opens the payload plane and builds the cache.
func (f *nodeFlags) join(ctx context.Context, logger *slog.Logger, extra ...coordinator.Option) (*joined, error) {
	mode := coordinator.ModeDegrade
	if f.strict {
		mode = coordinator.ModeStrict
	}
	nc, err := coordinator.Connect(f.natsURL, mode, f.natsOptions()...)
	if err != nil {
		return nil, err
	}
	j := &joined{nc: nc}
	sopts := []shm.Option{shm.WithNode(f.node)}
	if f.shmMaxBytes > 0 {
		sopts = append(sopts, shm.WithMaxBytes(f.shmMaxBytes))
	}
	if j.store, err = shm.Open(f.shmDir, sopts...); err != nil {
		nc.Close()
		return nil, err
	}
	opts := []coordinator.Option{coordinator.WithNode(f.node), coordinator.WithShm(j.store), coordinator.WithMode(mode),
		coordinator.WithReplicas(f.replicas), coordinator.WithLeaseTTL(f.leaseTTL), coordinator.WithStoreTTL(f.storeTTL),
		coordinator.WithLogger(logger), coordinator.WithEvents(0)}
	if f.payloadSweep != 0 {
		opts = append(opts, coordinator.WithPayloadSweep(f.payloadSweep))
	}
	if f.payloadListen != "" {
		l, err := net.Listen("tcp", f.payloadListen)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("payload listener: %w", err)
		}
		adv := f.advertise
		if adv == "" {
			adv = "http://" + l.Addr().String()
		}
		var sopts []httppull.ServerOption
		var topts []httppull.Option
		if f.token != "" {
			sopts = append(sopts, httppull.WithServerToken(f.token))
			topts = append(topts, httppull.WithToken(f.token))
		}
		tr, err := httppull.NewTransport(f.node, adv, j.store, topts...)
		if err != nil {
			l.Close()
			nc.Close()
			return nil, err
		}
		srv := &http.Server{Handler: httppull.NewServer(j.store, append(sopts, httppull.WithLogger(logger))...), ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(l)
		j.servers = append(j.servers, srv)
		opts = append(opts, coordinator.WithTransport(payload.TransportHTTP, tr), coordinator.WithGetter(payload.TransportShm, j.store))
	} else {
		opts = append(opts, coordinator.WithTransport(payload.TransportShm, j.store))
	}
	j.opts = append(opts, extra...)
	if j.cache, err = coordinator.New(ctx, nc, j.opts...); err != nil {
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
