package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"go.opentelemetry.io/otel/metric"
)

// ErrInvalidOption is returned by New for an option out of range.
var ErrInvalidOption = errors.New("reconciler: invalid option")

// Option configures a Reconciler.
type Option func(*settings) error

// Deleter removes payloads: a payload store or transport of this node's
// (payload.Transport is one). A delete is conditional on the generation
// read before the reconciler read the key's record (payload.Transport).
type Deleter interface {
	Generation(ctx context.Context, loc payload.Location) (payload.Generation, error)
	Delete(ctx context.Context, loc payload.Location, seen payload.Generation) error
}

type settings struct {
	bucket        string
	replicas      int
	shards        int // 0: as the bucket records
	leaseTTL      time.Duration
	allowance     time.Duration // 0: lease.DefaultClockAllowance(leaseTTL)
	markerTTL     time.Duration
	opTimeout     time.Duration
	node          string
	deleters      map[string]Deleter // by payload transport kind
	logger        *slog.Logger
	meterProvider metric.MeterProvider
	clock         lease.Clock
	stream        events.StreamConfig // the event stream's: its replicas are replicas'
	storeTTL      time.Duration       // the longest store TTL the workers use
	restoreEvery  time.Duration       // 0: half the store TTL; < 0: only when the stream discards
	checkEvery    time.Duration       // how often the stream's state is read
}

func defaults() settings {
	host, _ := os.Hostname()
	if host == "" {
		host = "node"
	}
	return settings{bucket: lease.DefaultBucket, replicas: 1, leaseTTL: 5 * time.Second, markerTTL: time.Minute,
		opTimeout: 2 * time.Second, node: host, deleters: map[string]Deleter{}, logger: slog.Default(), clock: lease.SystemClock{},
		storeTTL: time.Hour, checkEvery: time.Minute}
}

// WithNode names the node the reconciler runs on (default: the host
// name): it removes that node's payloads, and shared stores'.
func WithNode(node string) Option {
	return func(s *settings) error {
		if node == "" {
			return fmt.Errorf("%w: empty node name", ErrInvalidOption)
		}
		s.node = node
		return nil
	}
}

// WithBucket names the KV bucket (default lease.DefaultBucket).
func WithBucket(name string) Option {
	return func(s *settings) error {
		if name == "" {
			return fmt.Errorf("%w: empty bucket name", ErrInvalidOption)
		}
		s.bucket = name
		return nil
	}
}

// WithReplicas sets the replicas of the bucket and the event stream when
// the reconciler creates them (default 1).
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
// reconciler creates it (coordinator.WithLeaseShards says more); without
// it, the number the bucket records.
func WithLeaseShards(n int) Option {
	return func(s *settings) error {
		if n < 1 || n > lease.MaxShards {
			return fmt.Errorf("%w: lease shards must be 1..%d, got %d", ErrInvalidOption, lease.MaxShards, n)
		}
		s.shards = n
		return nil
	}
}

// WithLeaseTTL sets the election lease's TTL (default 5s): a standby takes
// over within about this long of the active one's death.
func WithLeaseTTL(d time.Duration) Option {
	return func(s *settings) error {
		if d < time.Second {
			return fmt.Errorf("%w: lease TTL must be >= 1s, got %v", ErrInvalidOption, d)
		}
		s.leaseTTL = d
		return nil
	}
}

// WithClockAllowance sets how far the clocks of the NATS servers and of
// the processes may disagree, a step included (default: a fifth of the
// lease TTL, at most 1s; at most half the lease TTL): the election lease's
// deadlines, and a touch's (a record's expiry less this), come that much
// early (docs/protocol.md 3.1).
func WithClockAllowance(d time.Duration) Option {
	return func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("%w: clock allowance must be > 0, got %v", ErrInvalidOption, d)
		}
		s.allowance = d
		return nil
	}
}

// WithOpTimeout bounds each store call (default 2s).
func WithOpTimeout(d time.Duration) Option {
	return func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("%w: op timeout must be > 0, got %v", ErrInvalidOption, d)
		}
		s.opTimeout = d
		return nil
	}
}

// WithDeleter lets the reconciler remove payloads of transport kind
// (payload.TransportShm, ...) with d: this node's, or a shared store's
// (payload.TransportMooncake). Other nodes remove theirs when the evicted
// event reaches them.
func WithDeleter(kind string, d Deleter) Option {
	return func(s *settings) error {
		if kind == "" || d == nil {
			return fmt.Errorf("%w: a payload deleter needs a transport kind and a deleter", ErrInvalidOption)
		}
		s.deleters[kind] = d
		return nil
	}
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

// WithMeterProvider sets where the metrics go (default: the global
// provider; docs/metrics.md).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(s *settings) error { s.meterProvider = mp; return nil }
}

// WithClock sets the clock the election lease's deadlines and the touches'
// expiries are measured with (default: the system clock).
func WithClock(c lease.Clock) Option {
	return func(s *settings) error {
		if c == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidOption)
		}
		s.clock = c
		return nil
	}
}

// WithEventsMaxBytes sets the event stream's MaxBytes (events.MinMaxBytes
// or more): the reconciler creates the stream with it, and gives it to an
// existing stream that has another when it becomes active (its process is
// the operator's, which may update the stream; docs/scaling.md says how
// to size it). Without it, a new stream gets events.DefaultMaxBytes and an
// existing one keeps its own.
func WithEventsMaxBytes(n int64) Option {
	return func(s *settings) error {
		if err := (events.StreamConfig{MaxBytes: n}).Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		s.stream.MaxBytes = n
		return nil
	}
}

// WithStoreTTL tells the reconciler the longest store TTL the cluster's
// workers use (default 1h, theirs; 1s to events.MaxStoreTTL): a live
// value's last event is younger than that, so the stream discarding
// events younger than it (and a touch interval and a marker TTL) may
// lose a live value's location, which the reconciler then counts and
// restores from the bucket.
func WithStoreTTL(d time.Duration) Option {
	return func(s *settings) error {
		if d < time.Second || d > events.MaxStoreTTL {
			return fmt.Errorf("%w: store TTL must be 1s to %v, got %v", ErrInvalidOption, events.MaxStoreTTL, d)
		}
		s.storeTTL = d
		return nil
	}
}

// WithRestoreEvery sets how often the active reconciler reads every
// committed record of the bucket and publishes the location of each the
// event stream has no event of (a published event lost, or discarded by
// the stream's limit): default half the store TTL (WithStoreTTL), so that
// such a value is found while its record lives. A negative d restores
// only when the stream is found discarding events a live value may need.
// Each pass reads every record and the last three events of each
// (docs/scaling.md: about 8,000 records a second).
func WithRestoreEvery(d time.Duration) Option {
	return func(s *settings) error {
		if d == 0 {
			return fmt.Errorf("%w: restore interval 0 (a negative one restores only after discards)", ErrInvalidOption)
		}
		s.restoreEvery = d
		return nil
	}
}
