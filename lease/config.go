package lease

import (
	"fmt"
	"time"
)

// Op is what a lease was doing when it was lost.
type Op uint8

// Ops.
const (
	OpRenew  Op = iota + 1 // a heartbeat
	OpCommit               // Held or Commit
)

// String returns "renew" or "commit".
func (o Op) String() string {
	switch o {
	case OpRenew:
		return "renew"
	case OpCommit:
		return "commit"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Config is how a lease is held. TTL is required.
type Config struct {
	// TTL is the lease's: each revision lives this long unless renewed.
	// At least 1s (JetStream keeps TTLs in whole seconds).
	TTL       time.Duration
	OpTimeout time.Duration // bound of each store call (0: 2s)
	Clock     Clock         // default: the system clock
	// ClockAllowance is how far the clocks of the servers (and of the
	// processes) may disagree, a step included: each revision's deadline
	// comes that much before its write's send time plus its TTL, because a
	// server expires a message by its own clock against the time stamp
	// another server may have given it. 0: DefaultClockAllowance(TTL). At
	// most half the TTL.
	ClockAllowance time.Duration
	Hooks          Hooks
}

// Hooks hear what happens to leases; every field is optional. They are
// called without the lease's locks held, on the goroutine that found what
// they report (the heartbeat's, or the caller's of Acquire, Held or
// Commit): keep them fast.
type Hooks struct {
	// Lost is called once for a lease that is lost, with what found it:
	// a renewal (OpRenew), or Held or Commit (OpCommit).
	Lost func(l *Lease, during Op, err error)
	// Late is called for a write acknowledged after its deadline (it is
	// not trusted: the server's TTL marker may wipe it).
	Late func(key string)
	// Ended is called when a lease's heartbeats have stopped: it was
	// committed, abandoned, lost, or stopped.
	Ended func(l *Lease)
}

func (c *Config) validate() error {
	if c.TTL < time.Second {
		return fmt.Errorf("%w: TTL must be >= 1s (JetStream TTLs are whole seconds), got %v", ErrInvalidConfig, c.TTL)
	}
	if c.OpTimeout < 0 {
		return fmt.Errorf("%w: op timeout %v < 0", ErrInvalidConfig, c.OpTimeout)
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = 2 * time.Second
	}
	a, err := ClockAllowance(c.TTL, c.ClockAllowance)
	if err != nil {
		return err
	}
	c.ClockAllowance = a
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	return nil
}

// deadline is the deadline of a revision whose write was sent at sent
// with ttl (the server rounds a TTL down to whole seconds; Bucket rounds
// every TTL it sends up, so ttl is never more than the server keeps).
func (c *Config) deadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - c.ClockAllowance)
}
