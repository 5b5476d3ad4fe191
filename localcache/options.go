package localcache

import (
	"fmt"
	"time"
)

// Clock tells the time. Tests inject a fake one so no TTL test sleeps.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Defaults: the RFC's sizing (256 entries of 8 MB) and compute timeout (30 s).
const (
	DefaultMaxBytes       = 2 << 30
	DefaultMaxEntries     = 256
	DefaultTTL            = time.Hour
	DefaultComputeTimeout = 30 * time.Second
)

// Budget is what a Cache may hold, and for how long. The zero value of
// each field is its default.
type Budget struct {
	// MaxBytes bounds the bytes held (by Value.Size). Pinned entries count
	// but are never evicted, so pins can hold the cache above it until
	// released. Default DefaultMaxBytes.
	MaxBytes int64
	// MaxEntries bounds the number of entries. Default DefaultMaxEntries.
	MaxEntries int
	// TTL is how long an entry lives after its last hit. Default
	// DefaultTTL.
	TTL time.Duration
	// Clock is what TTLs are measured with. Default: the system clock.
	Clock Clock
}

// Options configure a Cache: its Budget, and hooks typed by its K and V.
// The zero value of each field is its default; a nil hook is none.
type Options[K comparable, V Value] struct {
	Budget
	// ComputeTimeout bounds a compute: its context ends after it, and its
	// waiters get ErrComputeTimeout then even if the function ignores it.
	// Default DefaultComputeTimeout.
	ComputeTimeout time.Duration
	// OnEvict hears every entry that leaves the cache. It runs outside
	// the cache's lock, so it may call the cache.
	OnEvict func(key K, value V, cause Cause)
	// CloneOnGet makes every hit return CloneOnGet(value): a caller that
	// mutates what it got cannot corrupt the cached entry.
	CloneOnGet func(V) V
	// Checksum is a debug guard: each value is checksummed on insert and
	// again whenever a pin on it is released; a mismatch means some holder
	// wrote into a shared value. It is counted in Stats.Mutations and
	// reported to OnMutation (which may be nil). It costs a pass over the
	// value per release.
	Checksum   func(V) uint64
	OnMutation func(K)
	// Expiry gives entries a fixed expiry: when a value is inserted,
	// Expiry(key, value) returns when it must go (true), or false for the
	// sliding TTL. An entry with a fixed expiry is not extended by hits,
	// only by Touch. Expiry runs under the cache's lock: keep it cheap and
	// do not call the cache.
	Expiry func(K, V) (time.Time, bool)
}

// Validate reports a field out of range, or a hook without the one it
// needs, as ErrInvalidOption.
func (o Options[K, V]) Validate() error {
	switch {
	case o.MaxBytes < 0:
		return fmt.Errorf("%w: max bytes must be >= 0, got %d", ErrInvalidOption, o.MaxBytes)
	case o.MaxEntries < 0:
		return fmt.Errorf("%w: max entries must be >= 0, got %d", ErrInvalidOption, o.MaxEntries)
	case o.TTL < 0:
		return fmt.Errorf("%w: ttl must be >= 0, got %v", ErrInvalidOption, o.TTL)
	case o.ComputeTimeout < 0:
		return fmt.Errorf("%w: compute timeout must be >= 0, got %v", ErrInvalidOption, o.ComputeTimeout)
	case o.OnMutation != nil && o.Checksum == nil:
		return fmt.Errorf("%w: OnMutation without a Checksum", ErrInvalidOption)
	}
	return nil
}

// settings are the options with their defaults in place.
type settings struct {
	maxBytes       int64
	maxEntries     int
	ttl            time.Duration
	clock          Clock
	computeTimeout time.Duration
}

func (o Options[K, V]) settings() settings {
	s := settings{maxBytes: o.MaxBytes, maxEntries: o.MaxEntries, ttl: o.TTL, clock: o.Clock, computeTimeout: o.ComputeTimeout}
	if s.maxBytes == 0 {
		s.maxBytes = DefaultMaxBytes
	}
	if s.maxEntries == 0 {
		s.maxEntries = DefaultMaxEntries
	}
	if s.ttl == 0 {
		s.ttl = DefaultTTL
	}
	if s.clock == nil {
		s.clock = systemClock{}
	}
	if s.computeTimeout == 0 {
		s.computeTimeout = DefaultComputeTimeout
	}
	return s
}
