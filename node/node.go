package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats.go"
)

// readyPoll is how often Ready looks at the Cache's store reachability.
const readyPoll = 50 * time.Millisecond

// Node is one process's membership of the cluster: its NATS connection,
// payload plane and Cache. Start it once, Close it once; the accessors are
// safe for concurrent use after Start.
type Node struct {
	opts Options

	nc       *nats.Conn
	store    *shm.Store
	cache    *coordinator.Cache
	server   *http.Server // the pull server (PayloadHTTP), or nil
	addr     string       // the pull server's listen address, or ""
	mooncake io.Closer    // the Mooncake store (PayloadMooncake), or nil
	started  bool
	closed   bool
}

// New validates opts and returns a node that is not started yet. The
// error wraps ErrInvalidOption, or is ErrMooncakeNotBuilt.
func New(opts Options) (*Node, error) {
	opts.NATSOptions = append([]nats.Option(nil), opts.NATSOptions...)
	opts.Cache = append([]coordinator.Option(nil), opts.Cache...)
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &Node{opts: opts}, nil
}

// Start connects to NATS, opens the shm store (and the Mooncake store),
// starts the pull server and builds the Cache. In the default mode an
// unreachable NATS is not an error: the Cache computes locally until it is
// back (see Ready). On error everything opened so far is released. A
// second call returns ErrStarted.
func (n *Node) Start(ctx context.Context) (err error) {
	if n.started {
		return ErrStarted
	}
	n.started = true
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	o := &n.opts
	mode := coordinator.ModeDegrade
	if o.Strict {
		mode = coordinator.ModeStrict
	}
	if n.nc, err = coordinator.Connect(o.NATSURL, mode, o.NATSOptions...); err != nil {
		return err
	}
	sopts := []shm.Option{shm.WithNode(o.Name)}
	if o.ShmMaxBytes > 0 {
		sopts = append(sopts, shm.WithMaxBytes(o.ShmMaxBytes))
	}
	if n.store, err = shm.Open(o.ShmDir, sopts...); err != nil {
		return err
	}
	plane, err := n.openPayload()
	if err != nil {
		return err
	}
	opts := append(o.cacheOptions(), coordinator.WithShm(n.store))
	opts = append(opts, plane...)
	n.cache, err = coordinator.New(ctx, n.nc, append(opts, o.Cache...)...)
	return err
}

// openPayload opens the transport this node writes with and returns the
// Cache options that route to it.
func (n *Node) openPayload() ([]coordinator.Option, error) {
	o := &n.opts
	switch o.Payload {
	case PayloadHTTP:
		tr, err := n.listenHTTP()
		if err != nil {
			return nil, err
		}
		return []coordinator.Option{coordinator.WithTransport(payload.TransportHTTP, tr), coordinator.WithGetter(payload.TransportShm, n.store)}, nil
	case PayloadMooncake:
		mc, err := openMooncake(o.Name, o.Mooncake)
		if err != nil {
			return nil, err
		}
		n.mooncake = mc
		return []coordinator.Option{coordinator.WithTransport(payload.TransportMooncake, mc), coordinator.WithGetter(payload.TransportShm, n.store)}, nil
	}
	return []coordinator.Option{coordinator.WithTransport(payload.TransportShm, n.store)}, nil
}

// listenHTTP starts the pull server over the shm store and returns the
// transport that pulls from the others.
func (n *Node) listenHTTP() (*httppull.Transport, error) {
	o := &n.opts
	l, err := net.Listen("tcp", o.PayloadListen)
	if err != nil {
		return nil, fmt.Errorf("payload listener: %w", err)
	}
	adv := o.Advertise
	if adv == "" {
		adv = "http://" + l.Addr().String()
	}
	sopts := []httppull.ServerOption{httppull.WithLogger(o.Logger)}
	var topts []httppull.Option
	if o.PayloadToken != "" {
		sopts = append(sopts, httppull.WithServerToken(o.PayloadToken))
		topts = append(topts, httppull.WithToken(o.PayloadToken))
	}
	tr, err := httppull.NewTransport(o.Name, adv, n.store, topts...)
	if err != nil {
		l.Close()
		return nil, err
	}
	n.server = &http.Server{Handler: httppull.NewServer(n.store, sopts...), ReadHeaderTimeout: 10 * time.Second}
	n.addr = l.Addr().String()
	go n.server.Serve(l)
	return tr, nil
}

// Ready waits until the Cache reaches the KV bucket, so that computes are
// shared, or until ctx ends: then the error wraps ErrNotReady and ctx's
// error. Before Start it returns ErrNotStarted.
func (n *Node) Ready(ctx context.Context) error {
	if n.cache == nil {
		return ErrNotStarted
	}
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	for !n.cache.Stats().StoreReachable {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrNotReady, context.Cause(ctx))
		case <-t.C:
		}
	}
	return nil
}

// Close releases the node in the reverse order of Start: the Cache, the
// pull server (waiting at most 2s for pulls in flight), the Mooncake store,
// the NATS connection. Calls after the first do nothing; the accessors
// keep answering.
func (n *Node) Close() error {
	if n.closed {
		return nil
	}
	n.closed = true
	var errs []error
	if n.cache != nil {
		errs = append(errs, n.cache.Close())
	}
	if n.server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := n.server.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("payload server: %w", err))
		}
		cancel()
	}
	if n.mooncake != nil {
		errs = append(errs, n.mooncake.Close())
	}
	if n.nc != nil {
		n.nc.Close()
	}
	return errors.Join(errs...)
}

// Cache is the node's Cache (nil before Start).
func (n *Node) Cache() *coordinator.Cache { return n.cache }

// Store is the node's shm payload store (nil before Start).
func (n *Node) Store() *shm.Store { return n.store }

// Conn is the node's NATS connection (nil before Start).
func (n *Node) Conn() *nats.Conn { return n.nc }

// PayloadAddr is the address the pull server listens on ("" unless the
// payload is PayloadHTTP), with the port chosen when PayloadListen asks
// for port 0.
func (n *Node) PayloadAddr() string { return n.addr }

// Name is the node's name.
func (n *Node) Name() string { return n.opts.Name }
