package lease

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestDeadlineComesAClockAllowanceEarly: a revision's deadline is its
// write's send time plus its TTL less the clock allowance (default: a
// fifth of the TTL, at most 1s), so that a server whose clock runs that
// much ahead of the one that stamped the message has not expired it yet.
func TestDeadlineComesAClockAllowanceEarly(t *testing.T) {
	for _, c := range []struct {
		allowance, want time.Duration
	}{{0, time.Second}, {5 * time.Second, 5 * time.Second}} {
		f := newFixture(t, false)
		cfg := f.config()
		cfg.ClockAllowance = c.allowance
		rec := Record{V: RecordVersion, State: StateComputing, Owner: "test/1/x", Nonce: "n"}
		l, err := Acquire(context.Background(), f.store(), kvKey(20), rec, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Stop)
		f.clock.Advance(longLease - c.want - time.Millisecond)
		if err := l.Held(); err != nil {
			t.Fatalf("allowance %v: a millisecond before the deadline: %v", c.allowance, err)
		}
		f.clock.Advance(time.Millisecond)
		if err := l.Held(); !errors.Is(err, ErrLost) {
			t.Fatalf("allowance %v: at send time + TTL - %v: %v, want ErrLost", c.allowance, c.want, err)
		}
	}
}

func TestClockAllowanceIsChecked(t *testing.T) {
	f := newFixture(t, false)
	for _, a := range []time.Duration{-time.Second, longLease/2 + 1} {
		cfg := f.config()
		cfg.ClockAllowance = a
		rec := Record{V: RecordVersion, State: StateComputing, Owner: "test/1/x", Nonce: "n"}
		if _, err := Acquire(context.Background(), f.store(), kvKey(21), rec, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("allowance %v: %v, want ErrInvalidConfig", a, err)
		}
	}
}

// TestNothingIsPurgedPastTheDeadline: an abandon past the deadline, and a
// create acknowledged past it, leave the record to expire on the server;
// a purge then could let a next holder write what the revision's pending
// expiry marker wipes.
func TestNothingIsPurgedPastTheDeadline(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	l := f.acquire(t, 22)
	rev := l.Revision()
	f.clock.Advance(longLease - time.Second)
	if err := l.Abandon(ctx); err != nil {
		t.Fatalf("abandon past the deadline: %v", err)
	}
	if cur := f.read(t, kvKey(22)); !cur.Live || cur.Rev != rev {
		t.Fatalf("abandon past the deadline wrote: %+v, want revision %d left", cur, rev)
	}
}

// TestALateCreateIsNotPurged: a create acknowledged past its deadline is
// ErrLate, and its record is left to expire on the server (see above).
func TestALateCreateIsNotPurged(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	f.onNext("create", func(err error) error { f.clock.Advance(longLease); return err })
	rec := Record{V: RecordVersion, State: StateComputing, Owner: "test/1/x", Nonce: "n"}
	if _, err := Acquire(ctx, f.store(), kvKey(23), rec, f.config()); !errors.Is(err, ErrLate) {
		t.Fatalf("a create acknowledged past its deadline: %v, want ErrLate", err)
	}
	if cur := f.read(t, kvKey(23)); !cur.Live || cur.Record.State != StateComputing {
		t.Fatalf("a late create's record was purged: %+v", cur)
	}
	if _, late := f.heard(); late != 1 {
		t.Fatalf("late %d, want 1", late)
	}
}

// createBound records how long Acquire lets its create run (and resend a
// write refused while another is in flight: Bucket.Create's whileInFlight).
type createBound struct {
	Store
	left chan time.Duration
}

func (c createBound) Create(ctx context.Context, key string, r Record, ttl time.Duration) (uint64, error) {
	if d, ok := ctx.Deadline(); ok {
		c.left <- time.Until(d)
	} else {
		c.left <- -1
	}
	return c.Store.Create(ctx, key, r, ttl)
}

// TestACreateIsNotWaitedForPastItsDeadline: Acquire waits for its
// create's answer, and resends it, only until the deadline (TTL less the
// allowance): a create answered after it is ErrLate, and its record (left
// to expire) would block the key for a whole TTL. (It waited until the TTL.)
func TestACreateIsNotWaitedForPastItsDeadline(t *testing.T) {
	f := newFixture(t, false)
	st := createBound{f.b, make(chan time.Duration, 1)}
	cfg := Config{TTL: 2 * time.Second, ClockAllowance: time.Second} // the system clock: the context's is real time too
	rec := Record{V: RecordVersion, State: StateComputing, Owner: "test/1/x", Nonce: "n"}
	l, err := Acquire(context.Background(), st, kvKey(40), rec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	left := <-st.left
	if want := cfg.TTL - cfg.ClockAllowance; left < 0 || left > want {
		t.Fatalf("the create may run (and be resent) for %v, past its deadline (%v after it was sent)", left.Round(time.Millisecond), want)
	}
}
