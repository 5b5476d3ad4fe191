package lease

import (
	"fmt"
	"time"
)

// Clock tells the time. Deadlines are measured with it; tests inject a
// fake one so that no lease test waits out a TTL.
type Clock interface{ Now() time.Time }

// SystemClock is the system's clock, whose monotonic reading deadlines
// are measured with.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// DefaultClockAllowance is the clock allowance of a lease of ttl: a fifth
// of it, at most 1s (docs/protocol.md 3.1).
func DefaultClockAllowance(ttl time.Duration) time.Duration { return min(time.Second, ttl/5) }

// ClockAllowance returns the clock allowance a lease of ttl holds with:
// a, or DefaultClockAllowance(ttl) if a is 0. One outside [0, ttl/2] is
// ErrInvalidConfig: a renewal a third of the TTL in must still come before
// the deadline.
func ClockAllowance(ttl, a time.Duration) (time.Duration, error) {
	if a < 0 || a > ttl/2 {
		return 0, fmt.Errorf("%w: clock allowance %v out of [0, half the lease TTL = %v]", ErrInvalidConfig, a, ttl/2)
	}
	if a == 0 {
		return DefaultClockAllowance(ttl), nil
	}
	return a, nil
}
