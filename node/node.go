package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/live"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// readyPoll is how often Ready looks at the store's reachability.
	readyPoll = 50 * time.Millisecond
	// readyAsk bounds one JetStream request of Ready (NoCache), so that a
	// server that holds a request unanswered is asked again.
	readyAsk = 2 * time.Second
)

// Node is one process's membership of the cluster: its NATS connection,
// payload plane, Cache and reconciler. Start it once, Close it once; the
// accessors are safe for concurrent use after Start.
type Node struct {
	opts Options

	nc       *nats.Conn
	store    *shm.Store
	cache    *coordinator.Cache     // nil with NoCache
	rec      *reconciler.Reconciler // nil without Reconciler
	stopRec  context.CancelFunc     // ends rec's Run
	recDone  chan struct{}          // closed when rec's Run has returned
	server   *http.Server           // the pull server (PayloadHTTP), or nil
	addr     string                 // the pull server's listen address, or ""
	adv      string                 // the URL other nodes pull from it at, or ""
	mooncake mooncakeTransport      // the Mooncake store (PayloadMooncake), or nil
	pull     *httppull.Transport    // the HTTP transport (PayloadHTTP), or nil
	// stopCheck ends checkAdvertised, which closes checkDone (nil when the
	// node runs its own pull server, or writes no HTTP values).
	stopCheck context.CancelFunc
	checkDone chan struct{}
	// summaries publishes the live summary until stopSummaries, which
	// closes summariesDone (nil with a negative SummaryInterval).
	summaries     *live.Publisher
	stopSummaries context.CancelFunc
	summariesDone chan struct{}
	started       bool
	closed        bool
}

// New validates opts and returns a node that is not started yet. The
// error wraps ErrInvalidOption, or is ErrMooncakeNotBuilt.
func New(opts Options) (*Node, error) {
	opts.NATSOptions = append([]nats.Option(nil), opts.NATSOptions...)
	opts.Cache = append([]coordinator.Option(nil), opts.Cache...)
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &Node{opts: opts}, nil
}

// Start connects to NATS, opens the shm store (and the Mooncake store),
// starts the pull server, builds the Cache (unless NoCache) and starts the
// reconciler (with Reconciler; it runs until Close, not until ctx ends)
// and the publisher of the process's live summary (package live, unless
// SummaryInterval < 0). It does not wait for JetStream: Ready does. A shm directory another
// local user owns, links or may write is an error matching
// shm.ErrUnsafeDir (shm.Open).
// In the default mode an unreachable NATS is not an error: the Cache
// computes locally until it is back (see Ready). On error everything
// opened so far is released. A second call returns ErrStarted.
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
	if n.nc, err = coordinator.Connect(o.NATSURL, o.mode(), append(o.connectionLog(), o.NATSOptions...)...); err != nil {
		return err
	}
	sopts := []shm.Option{shm.WithNode(o.Name)}
	if o.ShmMaxBytes > 0 {
		sopts = append(sopts, shm.WithMaxBytes(o.ShmMaxBytes))
	}
	if o.ShmGroup != "" {
		sopts = append(sopts, shm.WithGroup(o.ShmGroup))
	}
	if n.store, err = shm.Open(o.ShmDir, sopts...); err != nil {
		return err
	}
	plane, err := n.openPayload()
	if err != nil {
		return err
	}
	if n.pull != nil && o.PayloadListen == "" {
		cctx, cancel := context.WithCancel(context.Background())
		n.stopCheck, n.checkDone = cancel, make(chan struct{})
		go func() {
			defer close(n.checkDone)
			n.checkAdvertised(cctx, n.pull)
		}()
	}
	if !o.NoCache {
		opts := append(o.cacheOptions(), coordinator.WithPayload(plane))
		if n.cache, err = coordinator.New(ctx, n.nc, append(opts, o.Cache...)...); err != nil {
			return err
		}
	}
	if o.Reconciler {
		if err := n.startReconciler(ctx); err != nil {
			return err
		}
	}
	return n.startSummaries()
}

// startReconciler runs a reconciler until Close. It deletes the payloads
// of this node's shm store and, with PayloadMooncake, of the Mooncake
// store the cluster shares.
func (n *Node) startReconciler(ctx context.Context) error {
	opts := append(n.opts.reconcilerOptions(), reconciler.WithDeleter(payload.TransportShm, n.store))
	if n.mooncake != nil {
		opts = append(opts, reconciler.WithDeleter(payload.TransportMooncake, n.mooncake))
	}
	rec, err := reconciler.New(n.nc, opts...)
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	n.rec, n.stopRec, n.recDone = rec, stop, make(chan struct{})
	go func() {
		defer close(n.recDone)
		rec.Run(rctx)
	}()
	return nil
}

// openPayload opens the transport this node writes with and returns the
// node's payload router: that transport, and the shm store for what was
// written on this node.
func (n *Node) openPayload() (*payload.Router, error) {
	o := &n.opts
	ropts := []payload.RouterOption{payload.WithNodeStore(n.store)}
	if o.PullToShm {
		ropts = append(ropts, payload.WithPullToNodeStore())
	}
	if o.Payload == PayloadHTTP {
		tr, err := n.listenHTTP()
		if err != nil {
			return nil, err
		}
		n.pull = tr
		return payload.NewRouter(o.Name, payload.TransportHTTP, tr, ropts...)
	}
	// A node that does not serve pulls still pulls from the nodes that do.
	pull, err := httppull.NewReader(o.pullOptions()...)
	if err != nil {
		return nil, err
	}
	ropts = append(ropts, payload.WithReader(payload.TransportHTTP, pull))
	if o.Payload == PayloadMooncake {
		mc, err := openMooncake(o.Name, o.Mooncake, o.Logger)
		if err != nil {
			return nil, err
		}
		n.mooncake = mc
		return payload.NewRouter(o.Name, payload.TransportMooncake, mc, ropts...)
	}
	return payload.NewRouter(o.Name, payload.TransportShm, n.store, ropts...)
}

// pullOptions are the options this node pulls HTTP values with: its
// token, sent only to its peers.
func (o *Options) pullOptions() []httppull.Option {
	var opts []httppull.Option
	if len(o.PayloadPeers) > 0 { // none named: the transport's default (httppull.WithPeers)
		opts = append(opts, httppull.WithPeers(o.PayloadPeers...))
	}
	if o.PayloadToken != "" {
		opts = append(opts, httppull.WithToken(o.PayloadToken))
	}
	return opts
}

// listenHTTP starts the pull server over the shm store (unless another
// process of the node serves it: Advertise without PayloadListen) and
// returns the transport that writes there and pulls from the others.
func (n *Node) listenHTTP() (*httppull.Transport, error) {
	o := &n.opts
	sopts := []httppull.ServerOption{httppull.WithLogger(o.Logger)}
	if o.PayloadToken != "" {
		sopts = append(sopts, httppull.WithServerToken(o.PayloadToken))
	}
	topts := o.pullOptions()
	if o.PayloadListen == "" {
		return httppull.NewTransport(o.Name, o.Advertise, n.store, topts...)
	}
	l, err := net.Listen("tcp", o.PayloadListen)
	if err != nil {
		return nil, fmt.Errorf("payload listener: %w", err)
	}
	adv := o.Advertise
	if adv == "" {
		if adv, err = advertiseOf(l.Addr()); err != nil {
			l.Close()
			return nil, err
		}
		if adv != "http://"+l.Addr().String() {
			o.Logger.Info("embcache: payload server advertised at this host's name (--advertise to say otherwise)",
				"listen", l.Addr().String(), "advertise", adv)
		}
	}
	tr, err := httppull.NewTransport(o.Name, adv, n.store, topts...)
	if err != nil {
		l.Close()
		return nil, err
	}
	h, err := httppull.NewServer(n.store, sopts...)
	if err != nil {
		l.Close()
		return nil, err
	}
	n.server = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	n.addr, n.adv = l.Addr().String(), adv
	go n.server.Serve(l)
	return tr, nil
}

// advertiseOf is the URL other nodes pull from a listener at addr: its
// address, or, for one on every address (":7070", "0.0.0.0:7070"), whose
// address no other machine can connect to, this host's name.
func advertiseOf(addr net.Addr) (string, error) {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return "http://" + addr.String(), nil
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "", fmt.Errorf("payload listener %s listens on every address and this host has no name (%v): set Advertise (--advertise http://HOST:%d)", addr, err, tcp.Port)
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(tcp.Port)), nil
}

// Ready waits until the Cache reaches the KV bucket, so that computes are
// shared, or, with NoCache, until JetStream answers: the event stream is
// there (Ready creates it if it is missing) or, with NoEvents, the account
// answers. A connection alone is not ready: a server whose JetStream is
// down, or has no quorum, accepts connections and answers nothing. When
// ctx ends first the error wraps ErrNotReady and ctx's error (and, with
// NoCache, says what JetStream last answered). Before Start it returns
// ErrNotStarted.
func (n *Node) Ready(ctx context.Context) error {
	if n.nc == nil || (n.cache == nil && !n.opts.NoCache) {
		return ErrNotStarted
	}
	ready := func() error {
		if !n.cache.Stats().StoreReachable {
			return errors.New("the store is not reachable")
		}
		return nil
	}
	if n.cache == nil {
		ready = func() error { return n.jetStreamAnswers(ctx) }
	}
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	var last error // what JetStream last said (NoCache), not cut short by ctx
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if ctx.Err() == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if n.cache == nil && last != nil {
				return fmt.Errorf("%w: JetStream: %w (%w)", ErrNotReady, last, context.Cause(ctx))
			}
			return fmt.Errorf("%w: %w", ErrNotReady, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// jetStreamAnswers asks JetStream, within readyAsk, for the account (its
// answer says what is wrong: "jetstream not enabled", where a stream
// request finds no responder) and then, unless NoEvents, for the event
// stream, creating it if it is missing: a node that only serves is the
// one that makes it before any worker runs.
func (n *Node) jetStreamAnswers(ctx context.Context) error {
	if !n.nc.IsConnected() {
		return nats.ErrNoServers
	}
	js, err := jetstream.New(n.nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, readyAsk)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil || n.opts.NoEvents {
		return err
	}
	_, err = events.EnsureStream(ctx, js, events.StreamConfig{Replicas: n.opts.Replicas, MaxBytes: n.opts.EventsMaxBytes})
	return err
}

// Close releases the node in the reverse order of Start: the summary
// publisher (its last summary sent), the reconciler (waiting for its Run
// to return), the Cache, the pull server (waiting at
// most 2s for pulls in flight), the Mooncake store, the NATS connection.
// Calls after the first do nothing; the accessors keep answering.
func (n *Node) Close() error {
	if n.closed {
		return nil
	}
	n.closed = true
	if n.stopSummaries != nil { // first: its last summary has the counts of the requests done by now
		n.stopSummaries()
		<-n.summariesDone
	}
	if n.stopCheck != nil {
		n.stopCheck()
		<-n.checkDone
	}
	if n.rec != nil {
		n.stopRec()
		<-n.recDone
	}
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

// Cache is the node's Cache (nil before Start, and with NoCache).
func (n *Node) Cache() *coordinator.Cache { return n.cache }

// Reconciler is the node's reconciler (nil before Start, and without
// Reconciler), for its Stats.
func (n *Node) Reconciler() *reconciler.Reconciler { return n.rec }

// Store is the node's shm payload store (nil before Start).
func (n *Node) Store() *shm.Store { return n.store }

// Conn is the node's NATS connection (nil before Start).
func (n *Node) Conn() *nats.Conn { return n.nc }

// PayloadAddr is the address the pull server listens on ("" unless the
// payload is PayloadHTTP), with the port chosen when PayloadListen asks
// for port 0.
func (n *Node) PayloadAddr() string { return n.addr }

// PayloadAdvertise is the URL its values name for other nodes to pull
// from ("" unless the pull server runs): Advertise, or for a listener on
// every address, this host's name.
func (n *Node) PayloadAdvertise() string { return n.adv }

// Name is the node's name.
func (n *Node) Name() string { return n.opts.Name }

// Payload is the transport this node writes its values with (Options.Payload,
// its default filled in).
func (n *Node) Payload() string { return n.opts.Payload }

// connectionLog logs the connection's losses and returns: an operator sees
// an outage of a running process (which computes locally meanwhile, or
// fails its calls in strict mode), not only one at its start. Options of
// the caller's that set the same handlers come after, and win.
func (o *Options) connectionLog() []nats.Option {
	// Why connecting fails (TLS, credentials; in the default mode the
	// first connection is retried, and its error went unsaid), once per
	// reason. The callbacks run one at a time, on the connection's
	// callback goroutine.
	var said string
	return []nats.Option{
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil && err.Error() != said {
				said = err.Error()
				o.Logger.Warn("embcache: cannot connect to NATS, retrying", "err", err)
			}
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil && !nc.IsClosed() {
				o.Logger.Warn("embcache: NATS connection lost, reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			// At the level of the loss: an operator sees the outage's end.
			o.Logger.Warn("embcache: NATS connection back", "server", nc.ConnectedUrlRedacted())
		}),
	}
}
