package localcache

import (
	"fmt"
	"time"
)

// Clock tells the time. Tests inject a fake one so no TTL test sleeps.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Option configures a Cache.
type Option func(*settings) error

// settings holds the options. The hooks are typed by the Cache's K and V,
// which options do not know: New checks their types.
type settings struct {
	maxBytes       int64
	maxEntries     int
	ttl            time.Duration
	clock          Clock
	computeTimeout time.Duration
	onEvict        any // func(K, V, Cause)
	clone          any // func(V) V
	checksum       any // func(V) uint64
	onMutation     any // func(K)
	expiry         any // func(K, V) (time.Time, bool)
}

// Defaults: the RFC's sizing (256 entries of 8 MB) and compute timeout (30 s).
const (
	DefaultMaxBytes       = 2 << 30
	DefaultMaxEntries     = 256
	DefaultTTL            = time.Hour
	DefaultComputeTimeout = 30 * time.Second
)

// WithMaxBytes bounds the bytes held (by Value.Size). Pinned entries count
// but are never evicted, so pins can hold the cache above it until released.
func WithMaxBytes(n int64) Option {
	return func(s *settings) error {
		if n <= 0 {
			return fmt.Errorf("%w: max bytes must be > 0, got %d", ErrInvalidOption, n)
		}
		s.maxBytes = n
		return nil
	}
}

// WithMaxEntries bounds the number of entries.
func WithMaxEntries(n int) Option {
	return func(s *settings) error {
		if n <= 0 {
			return fmt.Errorf("%w: max entries must be > 0, got %d", ErrInvalidOption, n)
		}
		s.maxEntries = n
		return nil
	}
}

// WithTTL sets how long an entry lives after its last hit.
func WithTTL(d time.Duration) Option {
	return func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("%w: ttl must be > 0, got %v", ErrInvalidOption, d)
		}
		s.ttl = d
		return nil
	}
}

// WithExpiry gives entries a fixed expiry: when a value is inserted,
// expiry(key, value) returns when it must go (true), or false for the
// sliding TTL. An entry with a fixed expiry is not extended by hits, only
// by Touch. expiry runs under the cache's lock: keep it cheap and do not
// call the cache.
func WithExpiry[K comparable, V Value](expiry func(K, V) (time.Time, bool)) Option {
	return func(s *settings) error {
		if expiry == nil {
			return fmt.Errorf("%w: nil expiry", ErrInvalidOption)
		}
		s.expiry = expiry
		return nil
	}
}

// WithClock injects the clock that TTLs are measured with.
func WithClock(c Clock) Option {
	return func(s *settings) error {
		if c == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidOption)
		}
		s.clock = c
		return nil
	}
}

// WithComputeTimeout bounds a compute: its context ends after d, and its
// waiters get ErrComputeTimeout then even if the function ignores it.
func WithComputeTimeout(d time.Duration) Option {
	return func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("%w: compute timeout must be > 0, got %v", ErrInvalidOption, d)
		}
		s.computeTimeout = d
		return nil
	}
}

// WithOnEvict registers a callback for every entry that leaves the cache.
// It runs outside the cache's lock, so it may call the cache.
func WithOnEvict[K comparable, V Value](fn func(key K, value V, cause Cause)) Option {
	return func(s *settings) error {
		s.onEvict = fn
		return nil
	}
}

// WithCloneOnGet makes every hit return clone(value): a caller that
// mutates what it got cannot corrupt the cached entry.
func WithCloneOnGet[V Value](clone func(V) V) Option {
	return func(s *settings) error {
		if clone == nil {
			return fmt.Errorf("%w: nil clone function", ErrInvalidOption)
		}
		s.clone = clone
		return nil
	}
}

// WithMutationGuard is a debug guard: it checksums each value on insert and
// again whenever a pin on it is released; a mismatch means some holder
// wrote into a shared value. It is counted in Stats.Mutations and reported
// to onMutation (which may be nil). It costs a pass over the value per release.
func WithMutationGuard[K comparable, V Value](checksum func(V) uint64, onMutation func(K)) Option {
	return func(s *settings) error {
		if checksum == nil {
			return fmt.Errorf("%w: nil checksum function", ErrInvalidOption)
		}
		s.checksum, s.onMutation = checksum, onMutation
		return nil
	}
}
