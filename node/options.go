package node

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/localdir"
	"github.com/embcache/embcache/live"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

var (
	// ErrInvalidOption is returned by New for Options it cannot start a node from.
	ErrInvalidOption = errors.New("node: invalid option")
	// ErrMooncakeNotBuilt is returned by New for Payload "mooncake" in a
	// binary built without the mooncake tag (or without cgo).
	ErrMooncakeNotBuilt = errors.New("node: the mooncake payload transport is not in this binary: build it with cgo and -tags mooncake (docs/operations.md, Mooncake)")
	// ErrNotStarted is returned by Ready before Start has succeeded.
	ErrNotStarted = errors.New("node: not started")
	// ErrStarted is returned by a second Start.
	ErrStarted = errors.New("node: already started")
	// ErrNotReady is returned by Ready when ctx ends before the node is
	// ready: the store answers, or (NoCache) JetStream does.
	ErrNotReady = errors.New("node: store not reachable")
)

// The payload transports a node writes with (Options.Payload).
const (
	PayloadShm      = payload.TransportShm      // same machine only: every reader maps this node's files
	PayloadHTTP     = payload.TransportHTTP     // a pull server on PayloadListen; others pull over HTTP
	PayloadMooncake = payload.TransportMooncake // Mooncake Store (needs -tags mooncake)
)

// Options say how a node joins the cluster. Name and NATSURL are required;
// every zero value elsewhere is a default.
type Options struct {
	NATSURL     string        // NATS server URL(s), comma-separated
	NATSOptions []nats.Option // credentials, TLS, ...
	Strict      bool          // fail instead of computing locally when NATS is unreachable

	Name        string // this node's name in leases, locations and shm files
	ShmDir      string // shm payload directory (default shm.DefaultDir)
	ShmMaxBytes int64  // shm budget in bytes (0: the store's default)
	// ShmGroup is the group (a name or a gid) that may read the shm
	// store's values (shm.WithGroup): the processes of another user that
	// map them, vLLM's through an agent, which also lets that group
	// connect to its socket. This process must run as root or be a member
	// of it. Empty: the store is the owner's only.
	ShmGroup string

	// Payload is the transport this node writes with: PayloadShm,
	// PayloadHTTP or PayloadMooncake. Empty: PayloadHTTP when PayloadListen
	// or Advertise is set, else PayloadShm. Values in this node's shm store
	// are read from it whatever the transport, and every node pulls HTTP
	// Locations. Only HTTP and Mooncake Locations can be read on other
	// machines.
	Payload       string
	PayloadListen string // PayloadHTTP: the pull server's address
	// Advertise is the base URL others pull this node's values from
	// (PayloadHTTP; default http://<listen address>). Without
	// PayloadListen, another process of the node serves its shm store
	// there (embcache serve --payload-listen), and this one starts no
	// server.
	Advertise    string
	PayloadToken string // the bearer token of pulls, both ways: the pull server's, and sent to PayloadPeers
	// PayloadPeers are the pull servers (host:port, or http(s) base URLs)
	// this node pulls HTTP values from, and sends PayloadToken to
	// (httppull.WithPeers): a Location naming any other address is
	// refused, nothing sent there. Without them, a node with a token
	// pulls only from its own Advertise, one without from any address.
	PayloadPeers []string
	Mooncake     MooncakeOptions // PayloadMooncake: how to reach the store
	// PullToShm makes values pulled from other nodes land in this node's
	// shm store, verified as they are written, and be read from there
	// (payload.WithPullToNodeStore): for a node agent, which hands its
	// processes shm files anyway.
	PullToShm bool

	Bucket      string        // the lease bucket (default lease.DefaultBucket); one per account: see coordinator.WithBucket
	Replicas    int           // of the bucket and stream when this node creates them (0: the coordinator's default)
	LeaseShards int           // KV buckets the keys spread over when this node creates the bucket (0: as the bucket records, 1 if new)
	LeaseTTL    time.Duration // 0: the coordinator's default
	// ClockAllowance is how far the clocks of the NATS servers and of the
	// processes may disagree (0: a fifth of the lease TTL, at most 1s;
	// docs/protocol.md 3.1).
	ClockAllowance time.Duration
	StoreTTL       time.Duration // committed record TTL (0: the coordinator's default)
	PayloadSweep   time.Duration // shm sweep interval (0: the coordinator's default; < 0: never)
	NoEvents       bool          // run without the event stream (it is on by default)
	// EventsMaxBytes is the event stream's MaxBytes (events.MinMaxBytes or
	// more; 0: events.DefaultMaxBytes for a stream this node creates, and
	// an existing one's own). The node creates the stream with it; its
	// reconciler, the operator's process, gives it to an existing stream
	// too (docs/scaling.md says how to size it).
	EventsMaxBytes int64

	// Reconciler runs a reconciler on this node from Start to Close: one
	// in the cluster is active, the others stand by. It needs the event
	// stream, which it creates if it is missing.
	Reconciler bool
	// NoCache builds no Cache: the node only serves (its pull server, its
	// reconciler). Ready then waits for JetStream to answer, and creates
	// the event stream if it is missing (unless NoEvents).
	NoCache bool

	// Role names this process in its live summary (package live:
	// live.RoleServe, RoleWorker, RoleAgent; default live.RoleCache),
	// published every SummaryInterval (0: live.DefaultInterval; < 0:
	// none) on the subjects of SummaryTenant (the one tenant a process
	// of the single-account layout may publish for; "" for every tenant of
	// its account). Version is the binary's, in the summary.
	Role            string
	SummaryInterval time.Duration
	SummaryTenant   string
	Version         string
	// SummaryAdd, if set, adds the process's own figures to each summary
	// after the Cache's and the reconciler's (the agent's: its clients'
	// computed requests). It is called on the publisher's goroutine: keep
	// it to reading counters.
	SummaryAdd func(*live.Summary)

	Logger         *slog.Logger         // default slog.Default()
	MeterProvider  metric.MeterProvider // default: the global provider
	TracerProvider trace.TracerProvider // default: the global provider

	// Cache holds further options for the Cache (compute timeout, local
	// cache budget, ...), applied after the node's own. What Options sets
	// (node name, mode, bucket, replicas, TTLs, payload, telemetry) is set
	// here and not there: the reconciler does not see Cache.
	Cache []coordinator.Option
}

// MooncakeOptions say how to reach a Mooncake Store (payload/mooncake.Config
// without the node name, which is Options.Name).
type MooncakeOptions struct {
	Library           string // dlopen path (default "libmooncake_store.so")
	MasterServerAddr  string // required, e.g. "127.0.0.1:50051"
	MetadataServer    string // default "P2PHANDSHAKE"
	LocalHostname     string // the address peers reach this node at (default: Name)
	Protocol          string // "tcp" (default) or "rdma"
	DeviceName        string // RDMA devices; "" lets Mooncake choose
	GlobalSegmentSize uint64 // bytes this node contributes (default 512 MiB)
	LocalBufferSize   uint64 // bytes of transfer buffer (default 128 MiB)
	// NoSegment contributes no memory: a short-lived process (a worker),
	// whose objects would vanish with it; the node's long-lived process
	// (serve, the agent) holds the segment. GlobalSegmentSize must be 0.
	NoSegment bool
}

// Validate checks o and fills its defaults, as New does: the error wraps
// ErrInvalidOption, or is ErrMooncakeNotBuilt.
func (o *Options) Validate() error {
	if o.NATSURL == "" {
		return fmt.Errorf("%w: no NATS URL", ErrInvalidOption)
	}
	if o.Name == "" {
		return fmt.Errorf("%w: no node name", ErrInvalidOption)
	}
	if o.ShmDir == "" {
		o.ShmDir = shm.DefaultDir
	}
	if o.ShmMaxBytes < 0 {
		return fmt.Errorf("%w: shm budget %d < 0", ErrInvalidOption, o.ShmMaxBytes)
	}
	if _, err := localdir.LookupGroup(o.ShmGroup); err != nil {
		return fmt.Errorf("%w: shm group: %w", ErrInvalidOption, err)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Payload == "" {
		o.Payload = PayloadShm
		if o.PayloadListen != "" || o.Advertise != "" {
			o.Payload = PayloadHTTP
		}
	}
	switch o.Payload {
	case PayloadShm:
	case PayloadHTTP:
		if o.PayloadListen == "" && o.Advertise == "" {
			return fmt.Errorf("%w: payload %s needs a listen address (PayloadListen; --payload-listen), or the URL of this node's pull server (Advertise; --advertise)", ErrInvalidOption, o.Payload)
		}
	case PayloadMooncake:
		if !mooncakeBuilt {
			return ErrMooncakeNotBuilt
		}
		if o.Mooncake.MasterServerAddr == "" {
			return fmt.Errorf("%w: payload %s needs the master server's address", ErrInvalidOption, o.Payload)
		}
		if o.Mooncake.NoSegment && o.Mooncake.GlobalSegmentSize != 0 {
			return fmt.Errorf("%w: Mooncake NoSegment with a GlobalSegmentSize of %d", ErrInvalidOption, o.Mooncake.GlobalSegmentSize)
		}
	default:
		return fmt.Errorf("%w: payload %q (want %s, %s or %s)", ErrInvalidOption, o.Payload, PayloadShm, PayloadHTTP, PayloadMooncake)
	}
	if _, err := httppull.NewReader(httppull.WithPeers(o.PayloadPeers...)); err != nil {
		return fmt.Errorf("%w: payload peers: %w", ErrInvalidOption, err)
	}
	if err := (events.StreamConfig{MaxBytes: o.EventsMaxBytes}).Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	if o.SummaryInterval > 0 && o.SummaryInterval < 100*time.Millisecond {
		return fmt.Errorf("%w: summary interval %v (at least 100ms; < 0 for none)", ErrInvalidOption, o.SummaryInterval)
	}
	if o.SummaryTenant != "" {
		if err := cachekey.ValidateTenant(o.SummaryTenant); err != nil {
			return fmt.Errorf("%w: summary tenant: %w", ErrInvalidOption, err)
		}
	}
	if o.Reconciler && o.NoEvents {
		return fmt.Errorf("%w: a reconciler needs the event stream (NoEvents)", ErrInvalidOption)
	}
	if (o.PayloadListen != "" || o.Advertise != "") && o.Payload != PayloadHTTP {
		return fmt.Errorf("%w: a payload listen address or advertised URL with payload %s (they are %s's)", ErrInvalidOption, o.Payload, PayloadHTTP)
	}
	return nil
}

// mode is the Cache's and the connection's mode.
func (o *Options) mode() coordinator.Mode {
	if o.Strict {
		return coordinator.ModeStrict
	}
	return coordinator.ModeDegrade
}

// cacheOptions are the Cache's options for the node's parts.
func (o *Options) cacheOptions() []coordinator.Option {
	opts := []coordinator.Option{coordinator.WithNode(o.Name), coordinator.WithLogger(o.Logger), coordinator.WithMode(o.mode())}
	if o.Bucket != "" {
		opts = append(opts, coordinator.WithBucket(o.Bucket))
	}
	if o.Replicas != 0 {
		opts = append(opts, coordinator.WithReplicas(o.Replicas))
	}
	if o.LeaseShards != 0 {
		opts = append(opts, coordinator.WithLeaseShards(o.LeaseShards))
	}
	if o.LeaseTTL != 0 {
		opts = append(opts, coordinator.WithLeaseTTL(o.LeaseTTL))
	}
	if o.ClockAllowance != 0 {
		opts = append(opts, coordinator.WithClockAllowance(o.ClockAllowance))
	}
	if o.StoreTTL != 0 {
		opts = append(opts, coordinator.WithStoreTTL(o.StoreTTL))
	}
	if o.MeterProvider != nil {
		opts = append(opts, coordinator.WithMeterProvider(o.MeterProvider))
	}
	if o.TracerProvider != nil {
		opts = append(opts, coordinator.WithTracerProvider(o.TracerProvider))
	}
	if o.PayloadSweep != 0 {
		opts = append(opts, coordinator.WithPayloadSweep(o.PayloadSweep))
	}
	if !o.NoEvents {
		opts = append(opts, coordinator.WithEvents(0))
	}
	if o.EventsMaxBytes != 0 {
		opts = append(opts, coordinator.WithEventsMaxBytes(o.EventsMaxBytes))
	}
	return opts
}

// reconcilerOptions are the reconciler's options for the node's parts.
func (o *Options) reconcilerOptions() []reconciler.Option {
	opts := []reconciler.Option{reconciler.WithNode(o.Name), reconciler.WithLogger(o.Logger)}
	if o.Bucket != "" {
		opts = append(opts, reconciler.WithBucket(o.Bucket))
	}
	if o.Replicas != 0 {
		opts = append(opts, reconciler.WithReplicas(o.Replicas))
	}
	if o.LeaseShards != 0 {
		opts = append(opts, reconciler.WithLeaseShards(o.LeaseShards))
	}
	if o.LeaseTTL != 0 {
		opts = append(opts, reconciler.WithLeaseTTL(o.LeaseTTL))
	}
	if o.ClockAllowance != 0 {
		opts = append(opts, reconciler.WithClockAllowance(o.ClockAllowance))
	}
	if o.MeterProvider != nil {
		opts = append(opts, reconciler.WithMeterProvider(o.MeterProvider))
	}
	if o.EventsMaxBytes != 0 {
		opts = append(opts, reconciler.WithEventsMaxBytes(o.EventsMaxBytes))
	}
	if o.StoreTTL != 0 {
		opts = append(opts, reconciler.WithStoreTTL(o.StoreTTL))
	}
	return opts
}
