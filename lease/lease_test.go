package lease

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/embcache/embcache/payload"
)

// commit writes a committed record for an in-memory location.
func commit(ctx context.Context, l *Lease, i int) (uint64, error) {
	loc := payload.Location{Transport: payload.TransportMemory, Node: "test", Object: object(i).String(), Size: 4096,
		Checksum: payload.Checksum{byte(i)}}
	return l.Commit(ctx, loc, value(), time.Hour)
}

func assertLost(t *testing.T, l *Lease) {
	t.Helper()
	select {
	case <-l.Done():
	default:
		t.Fatal("lease not ended")
	}
	if !errors.Is(l.Err(), ErrLost) {
		t.Fatalf("lease error %v, want ErrLost", l.Err())
	}
}

// Acquire on a live key is ErrHeld; the record it writes carries the
// revision it made as Reserved.
func TestAcquireFencesTheKey(t *testing.T) {
	f := newFixture(t, false)
	l := f.acquire(t, 1)
	if got := l.Record().Reserved; got != l.Revision() {
		t.Fatalf("reserved %d, revision %d", got, l.Revision())
	}
	rec := l.Record()
	if _, err := Acquire(context.Background(), f.store(), kvKey(1), rec, f.config()); !errors.Is(err, ErrHeld) {
		t.Fatalf("second acquire: %v, want ErrHeld", err)
	}
	if _, err := f.b.CompareAndSet(context.Background(), kvKey(1), l.Revision()-1, rec, time.Minute); !errors.Is(err, ErrLost) {
		t.Fatalf("a write on an old revision: %v, want ErrLost", err)
	}
}

// Held past the deadline loses the lease (heard once, as a commit's) and
// nothing is written.
func TestHeldPastDeadlineLosesTheLease(t *testing.T) {
	f := newFixture(t, false)
	l := f.acquire(t, 2)
	rev := l.Revision()
	if err := l.Held(); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(longLease)
	if err := l.Held(); !errors.Is(err, ErrLost) {
		t.Fatalf("held past the deadline: %v", err)
	}
	if _, err := commit(context.Background(), l, 2); !errors.Is(err, ErrLost) {
		t.Fatalf("commit after: %v", err)
	}
	if lost, _ := f.heard(); !slices.Equal(lost, []Op{OpCommit}) {
		t.Fatalf("heard lost %v, want [commit]", lost)
	}
	if cur := f.read(t, kvKey(2)); cur.Rev != rev || cur.Record.State != StateComputing {
		t.Fatalf("server %+v, want the computing record at %d", cur, rev)
	}
}

// A renewal tried past the deadline ends the lease without a write.
func TestRenewalPastDeadlineEndsLease(t *testing.T) {
	f := newFixture(t, false)
	l := f.acquire(t, 3)
	rev := l.Revision()
	f.clock.Advance(longLease)
	if _, ok := l.beat(context.Background()); ok {
		t.Fatal("renewal past the deadline kept the lease")
	}
	assertLost(t, l)
	if cur := f.read(t, kvKey(3)); cur.Rev != rev {
		t.Fatalf("a write went out: revision %d, want %d", cur.Rev, rev)
	}
	if lost, _ := f.heard(); !slices.Equal(lost, []Op{OpRenew}) {
		t.Fatalf("heard lost %v, want [renew]", lost)
	}
}

// A renewal acknowledged at or after the deadline ends the lease, and the
// record it made is left to expire: the old revision's expiry marker may
// be pending, and would wipe what a waiter that took the key over wrote.
func TestLateRenewalEndsLease(t *testing.T) {
	f := newFixture(t, false)
	l := f.acquire(t, 4)
	rev := l.Revision()
	f.onNext("write", func(err error) error { f.clock.Advance(longLease); return err })
	if _, ok := l.beat(context.Background()); ok {
		t.Fatal("late renewal kept the lease")
	}
	assertLost(t, l)
	if cur := f.read(t, kvKey(4)); !cur.Live || cur.Rev != rev+1 {
		t.Fatalf("the late renewal's record was not left as it landed (revision %d): %+v", rev+1, cur)
	}
	if lost, late := f.heard(); late != 1 || len(lost) != 1 {
		t.Fatalf("late %d lost %v", late, lost)
	}
}

// A renewal whose answer was lost but which landed is adopted before the
// commit, which then goes on the renewal's revision.
func TestRenewalWithLostAckIsAdopted(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	l := f.acquire(t, 5)
	reserved := l.Revision()
	f.onNext("write", func(error) error { return context.DeadlineExceeded })
	if next, ok := l.beat(ctx); !ok || next >= longLease/3 {
		t.Fatalf("a renewal with an unknown outcome: next %v, kept %v; want a sooner retry", next, ok)
	}
	rev, err := commit(ctx, l, 5)
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	cur := f.read(t, kvKey(5))
	if cur.Record.State != StateCommitted || cur.Rev != reserved+2 || rev != cur.Rev {
		t.Fatalf("server at %d (%v), commit at %d; want it right after the renewal at %d",
			cur.Rev, cur.Record.State, rev, reserved+1)
	}
}

// A commit whose caller gave up while its answer was lost, and which
// landed, is found by the next renewal: the lease ends, and the committed
// record is not written over with a computing one.
func TestRenewalFindsLandedCommit(t *testing.T) {
	f := newFixture(t, false)
	l := f.acquire(t, 6)
	ctx, cancel := context.WithCancel(context.Background())
	f.onNext("write", func(error) error { cancel(); return context.DeadlineExceeded })
	if _, err := commit(ctx, l, 6); err == nil || errors.Is(err, ErrLost) {
		t.Fatalf("commit: %v, want the unknown outcome the caller gave up on", err)
	}
	committed := f.read(t, kvKey(6))
	for range 3 {
		if _, ok := l.beat(context.Background()); !ok {
			break
		}
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("lease still renewing a committed record")
	}
	if l.Err() != nil {
		t.Fatalf("lease error %v", l.Err())
	}
	if cur := f.read(t, kvKey(6)); cur.Rev != committed.Rev || cur.Record.State != StateCommitted {
		t.Fatalf("record at %d (%v), want the commit at %d untouched", cur.Rev, cur.Record.State, committed.Rev)
	}
}

// A direct get may be a follower's answer: it never proves that a write
// whose answer was lost landed.
func TestLostAckNotProvenByDirectRead(t *testing.T) {
	f := newFixture(t, true)
	l := f.acquire(t, 7)
	f.onNext("write", func(error) error { return context.DeadlineExceeded })
	if _, err := commit(context.Background(), l, 7); !errors.Is(err, ErrLost) {
		t.Fatalf("commit proven by a direct read: %v, want ErrLost", err)
	}
}

// Abandon purges the record on the lease's revision, so the key can be
// taken again at once; the heartbeats stop (Ended is heard).
func TestAbandonFreesTheKey(t *testing.T) {
	f := newFixture(t, false)
	l := f.acquire(t, 8)
	if err := l.Abandon(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.Stop()
	if cur := f.read(t, kvKey(8)); cur.Live {
		t.Fatalf("abandoned record live: %+v", cur)
	}
	f.acquire(t, 8)
	if err := l.Abandon(context.Background()); !errors.Is(err, ErrLost) {
		t.Fatalf("second abandon: %v, want ErrLost (ended)", err)
	}
	f.mu.Lock()
	ended := f.ended
	f.mu.Unlock()
	if ended != 1 {
		t.Fatalf("ended heard %d times", ended)
	}
}

// TestOrphanEndsWithoutWriting: an orphaned lease ends (Done closes, Err
// is the orphan's error, Ended is heard) and writes nothing: its record
// stays, to expire on the server.
func TestOrphanEndsWithoutWriting(t *testing.T) {
	f := newFixture(t, false)
	l := f.acquire(t, 10)
	rev := l.Revision()
	errClosing := errors.New("closing")
	l.Orphan(errClosing)
	select {
	case <-l.Done():
	default:
		t.Fatal("an orphaned lease has not ended")
	}
	if err := l.Err(); err != errClosing {
		t.Fatalf("Err %v, want the orphan's error", err)
	}
	if err := l.Held(); err != errClosing {
		t.Fatalf("Held %v, want the orphan's error", err)
	}
	if cur := f.read(t, kvKey(10)); !cur.Live || cur.Rev != rev {
		t.Fatalf("the orphaned lease wrote: %+v, want revision %d left", cur, rev)
	}
	f.mu.Lock()
	ended := f.ended
	f.mu.Unlock()
	if ended != 1 {
		t.Fatalf("ended heard %d times", ended)
	}
}

// TestACancelledAcquireGivesTheKeyBack: a create whose caller stops
// waiting while it is in flight (its ctx ends before the answer) is still
// answered, and a key it took is given back: Acquire returns ctx's error
// and the key is free at once, not a lease TTL later.
func TestACancelledAcquireGivesTheKeyBack(t *testing.T) {
	f := newFixture(t, false)
	ctx, cancel := context.WithCancel(context.Background())
	f.onNext("create", func(err error) error { cancel(); return err }) // landed; the caller has gone
	rec := Record{V: RecordVersion, State: StateComputing, Owner: "test/1/x", Nonce: "n"}
	l, err := Acquire(ctx, f.store(), kvKey(9), rec, f.config())
	if err == nil {
		l.Stop()
		t.Fatal("Acquire returned a lease to a caller whose ctx had ended")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire: %v, want context.Canceled", err)
	}
	if cur := f.read(t, kvKey(9)); cur.Live {
		t.Fatalf("the key a cancelled Acquire took is still held: %+v", cur)
	}
}

// The server keeps TTLs in whole seconds and truncates a fraction: what
// is sent is rounded up, so no message expires before its writer's deadline.
func TestWholeSeconds(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{
		{time.Millisecond, time.Second}, {time.Second, time.Second},
		{1500 * time.Millisecond, 2 * time.Second}, {time.Hour, time.Hour}, {time.Hour + 1, time.Hour + time.Second},
	} {
		if got := wholeSeconds(c.in); got != c.want {
			t.Errorf("wholeSeconds(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
