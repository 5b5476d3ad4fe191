package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Mode says what the Cache does when the store cannot be reached.
type Mode uint8

const (
	// ModeDegrade computes locally, counts it, and resumes sharing when the
	// store is back. The default.
	ModeDegrade Mode = iota
	// ModeStrict fails: New returns an error naming the server, and calls
	// return ErrStoreUnavailable.
	ModeStrict
)

// String returns "degrade" or "strict".
func (m Mode) String() string {
	if m == ModeStrict {
		return "strict"
	}
	return "degrade"
}

// Option configures a Cache.
type Option func(*settings) error

type settings struct {
	bucket         string
	replicas       int
	shards         int // 0: as the bucket records
	leaseTTL       time.Duration
	clockAllowance time.Duration // 0: lease.DefaultClockAllowance(leaseTTL)
	storeTTL       time.Duration
	markerTTL      time.Duration
	opTimeout      time.Duration
	pollInterval   time.Duration
	computeTimeout time.Duration
	retryInterval  time.Duration
	mode           Mode
	node           string
	router         *payload.Router
	payloadSweep   time.Duration
	local          localcache.Budget
	logger         *slog.Logger
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	tenants        []string // served tenants; nil: all (then the user needs bucket-wide permissions)
	events         bool
	touchInterval  time.Duration
	eventsMaxBytes int64 // the event stream's MaxBytes when this Cache creates it (0: the default)
	clock          Clock
	leaseStore     func(lease.Store) lease.Store // test hook: what the leases write and read through (default: the bucket)
	observer       Observer

	// test hook: called by Cache.Invalidate between its tombstone and its
	// event, with a ctx that ends when Close begins
	tombstoneWritten func(closing context.Context)
}

// Observer hears of every lease decision this Cache makes, with its
// fencing token: for audits, and for the fault-injection checker.
// Its methods are called synchronously: keep them fast.
type Observer interface {
	Reserved(ref Ref, rev uint64)
	Committed(ref Ref, rev uint64, sum payload.Checksum)
	Refused(ref Ref, rev uint64, err error)
}

// InvalidationObserver is an Observer that also hears of every
// invalidated event the Cache applies (a replayed one again), once the
// local copies of its labels are dropped and its flights marked; at is
// the event's Time, which tells the invalidations of one model apart.
type InvalidationObserver interface {
	Observer
	Invalidated(tenant, model string, epoch uint64, at time.Time)
}

// WithObserver registers an Observer (an InvalidationObserver is also
// told of invalidations).
func WithObserver(o Observer) Option {
	return func(s *settings) error { s.observer = o; return nil }
}

// DefaultLeaseTTL is how long a lease lives without a heartbeat unless
// WithLeaseTTL says otherwise.
const DefaultLeaseTTL = 5 * time.Second

func defaults() settings {
	host, _ := os.Hostname()
	if host == "" {
		host = "node"
	}
	return settings{
		bucket:         lease.DefaultBucket,
		replicas:       1,
		leaseTTL:       DefaultLeaseTTL,
		storeTTL:       time.Hour,
		markerTTL:      time.Minute,
		opTimeout:      2 * time.Second,
		computeTimeout: localcache.DefaultComputeTimeout,
		retryInterval:  time.Second,
		node:           host,
		logger:         slog.Default(),
		clock:          lease.SystemClock{},
	}
}

// Clock tells the time. Lease deadlines and record ages are measured with
// it; tests inject a fake one so that no lease test waits out a TTL.
type Clock = lease.Clock

// WithClock sets the clock lease deadlines and record ages are measured
// with (default: the system clock, whose monotonic reading is used). The
// local cache has its own: WithLocalCache(localcache.Budget{Clock: c}).
func WithClock(c Clock) Option {
	return func(s *settings) error {
		if c == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidOption)
		}
		s.clock = c
		return nil
	}
}

func positive(name string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: %s must be > 0, got %v", ErrInvalidOption, name, d)
	}
	return nil
}

// WithBucket names the KV bucket (default EMBCACHE_LEASES). Every bucket
// of an account shares its one event stream: an invalidation made through
// another bucket reaches this Cache too, which then shares no value of
// its labels until they are invalidated through this bucket as well, or
// 25 h pass (docs/protocol.md 4.4). Use one bucket per account.
func WithBucket(name string) Option {
	return func(s *settings) error {
		if name == "" {
			return fmt.Errorf("%w: empty bucket name", ErrInvalidOption)
		}
		s.bucket = name
		return nil
	}
}

// WithReplicas sets the bucket's replicas when New creates it (1 on one
// node, 3 in a cluster).
func WithReplicas(n int) Option {
	return func(s *settings) error {
		if n < 1 || n > 5 {
			return fmt.Errorf("%w: replicas must be 1..5, got %d", ErrInvalidOption, n)
		}
		s.replicas = n
		return nil
	}
}

// WithLeaseShards spreads the bucket's keys over n KV buckets when this
// process creates it (each a stream with its own Raft leader, so writes
// spread over a cluster's servers): 1..lease.MaxShards. The number is
// recorded in the bucket; a process without this option uses the
// recorded one, and one whose n differs from it fails to open the bucket.
func WithLeaseShards(n int) Option {
	return func(s *settings) error {
		if n < 1 || n > lease.MaxShards {
			return fmt.Errorf("%w: lease shards must be 1..%d, got %d", ErrInvalidOption, lease.MaxShards, n)
		}
		s.shards = n
		return nil
	}
}

// WithLeaseTTL sets how long a lease lives without a heartbeat (default
// DefaultLeaseTTL, at least 1s): the time a crashed holder blocks its key. Heartbeats go
// every third. JetStream keeps TTLs in whole seconds: a fraction is
// rounded up on the wire, while the holder gives the lease up by d.
func WithLeaseTTL(d time.Duration) Option {
	return func(s *settings) error {
		if d < time.Second {
			return fmt.Errorf("%w: lease TTL must be >= 1s (JetStream TTLs are whole seconds), got %v", ErrInvalidOption, d)
		}
		s.leaseTTL = d
		return nil
	}
}

// WithClockAllowance sets how far the clocks of the NATS servers and of
// the processes may disagree, a step included (default: a fifth of the
// lease TTL, at most 1s; at most half the lease TTL). Every lease revision's
// deadline comes that much early (docs/protocol.md 3.1), and so does the
// reconciler's for a touch.
func WithClockAllowance(d time.Duration) Option {
	return func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("%w: clock allowance must be > 0, got %v", ErrInvalidOption, d)
		}
		s.clockAllowance = d
		return nil
	}
}

// WithStoreTTL sets how long a committed record (and so its payload) lives
// (default 1h), from 1s to events.MaxStoreTTL (24h: a value's last event
// must outlive it in the stream).
func WithStoreTTL(d time.Duration) Option {
	return func(s *settings) error {
		if d < time.Second || d > events.MaxStoreTTL {
			return fmt.Errorf("%w: store TTL must be 1s to %v, got %v", ErrInvalidOption, events.MaxStoreTTL, d)
		}
		s.storeTTL = d
		return nil
	}
}

// WithPayloadSweep sets how often this process removes the files of its
// node store (payload.WithNodeStore) that hold no live committed record's
// bytes: expired or invalidated while no reconciler ran, left by a commit
// that failed, or of a key computed again to other bytes. A file with the
// live record's bytes is a copy of the value, wherever the record says it
// is, and stays. A file is kept while it is younger than one interval (a
// commit may be about to name it).
// Default: half the store TTL, between 30 s and 10 min; d < 0 turns it
// off.
func WithPayloadSweep(d time.Duration) Option {
	return func(s *settings) error {
		if d == 0 {
			return fmt.Errorf("%w: payload sweep interval 0 (< 0 turns it off)", ErrInvalidOption)
		}
		s.payloadSweep = d
		return nil
	}
}

// WithOpTimeout bounds each KV operation when the caller's context has a
// later deadline (default 2s).
func WithOpTimeout(d time.Duration) Option {
	return func(s *settings) error { s.opTimeout = d; return positive("op timeout", d) }
}

// WithPollInterval sets how often a waiter re-reads a key besides the
// changes it hears (default: a fifth of the lease TTL).
func WithPollInterval(d time.Duration) Option {
	return func(s *settings) error { s.pollInterval = d; return positive("poll interval", d) }
}

// WithComputeTimeout bounds a compute and the wait for one (default 30s);
// waiters past it get ErrComputeTimeout.
func WithComputeTimeout(d time.Duration) Option {
	return func(s *settings) error { s.computeTimeout = d; return positive("compute timeout", d) }
}

// WithMode sets what happens when the store cannot be reached.
func WithMode(m Mode) Option {
	return func(s *settings) error {
		if m != ModeDegrade && m != ModeStrict {
			return fmt.Errorf("%w: mode %d", ErrInvalidOption, m)
		}
		s.mode = m
		return nil
	}
}

// WithNode names this node in owners and Locations (default: the hostname).
func WithNode(node string) Option {
	return func(s *settings) error {
		if node == "" {
			return fmt.Errorf("%w: empty node name", ErrInvalidOption)
		}
		s.node = node
		return nil
	}
}

// WithPayload sets the node's payload plane: the transport values are
// written with, the transports that read other nodes' Locations, and the
// node's own store (default: an in-memory store, which shares values only
// within this process).
func WithPayload(r *payload.Router) Option {
	return func(s *settings) error {
		if r == nil {
			return fmt.Errorf("%w: nil payload router", ErrInvalidOption)
		}
		s.router = r
		return nil
	}
}

// WithLocalCache sets the in-process cache's budget, TTL and clock (its
// zero fields are localcache's defaults); the Cache sets its hooks.
func WithLocalCache(b localcache.Budget) Option {
	return func(s *settings) error {
		if b.MaxBytes < 0 || b.MaxEntries < 0 || b.TTL < 0 {
			return fmt.Errorf("%w: local cache budget %+v has a negative field", ErrInvalidOption, b)
		}
		s.local = b
		return nil
	}
}

// WithEvents turns the event stream on: the Cache publishes published,
// touched (at most once per key per touchInterval; 0 means a quarter of
// the store TTL, at most a minute) and abandoned events, and follows
// invalidated events and the eviction notices of its node.
func WithEvents(touchInterval time.Duration) Option {
	return func(s *settings) error {
		if touchInterval < 0 {
			return fmt.Errorf("%w: touch interval %v", ErrInvalidOption, touchInterval)
		}
		s.events, s.touchInterval = true, touchInterval
		return nil
	}
}

// WithEventsMaxBytes sets the event stream's MaxBytes when this Cache
// creates it (events.MinMaxBytes or more; default events.DefaultMaxBytes):
// the first process of a cluster may be a worker. An existing stream keeps
// its own: only the operator's process changes it (the reconciler's,
// serve --events-max-bytes); a Cache given another limit says so in its
// log. docs/scaling.md says how to size it.
func WithEventsMaxBytes(n int64) Option {
	return func(s *settings) error {
		if err := (events.StreamConfig{MaxBytes: n}).Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		s.eventsMaxBytes = n
		return nil
	}
}

// WithTenants restricts the Cache to these tenants, so that it works
// under NATS credentials that allow only their subjects: it subscribes per
// tenant, reads records with direct gets by subject, and refuses other
// tenants' keys. That is the older layout of every tenant in one NATS
// account, which keeps honest tenants apart but not a hostile one
// (reply subjects, rollups, stream info, no quotas); a tenant in a NATS
// account of its own needs no such option (docs/operations.md, "Tenant
// isolation").
func WithTenants(tenants ...string) Option {
	return func(s *settings) error {
		if len(tenants) == 0 {
			return fmt.Errorf("%w: no tenants", ErrInvalidOption)
		}
		for _, t := range tenants {
			if err := cachekey.ValidateTenant(t); err != nil {
				return fmt.Errorf("%w: %w", ErrInvalidOption, err)
			}
		}
		s.tenants = append([]string(nil), tenants...)
		return nil
	}
}

// WithTracerProvider sets where spans go (default: the global provider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(s *settings) error { s.tracerProvider = tp; return nil }
}

// WithMeterProvider sets where metrics go (default: the global provider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(s *settings) error { s.meterProvider = mp; return nil }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(s *settings) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		s.logger = l
		return nil
	}
}
