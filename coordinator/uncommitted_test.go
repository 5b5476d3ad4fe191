package coordinator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/fakeclock"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// slowPut is a transport whose Put takes so long (by the Cache's clock)
// that the lease's deadline passes while it writes: a 100 MB value put
// under CPU pressure.
type slowPut struct {
	*payload.MemoryStore
	clock *fakeclock.Clock
	by    time.Duration
}

func (s slowPut) Put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	loc, err := s.MemoryStore.Put(ctx, obj, v)
	s.clock.Advance(s.by)
	return loc, err
}

// settleUncommitted waits until the Cache has no uncommitted payload
// waiting.
func settleUncommitted(t *testing.T, c *Cache) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for c.uncommitted.len() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d uncommitted payloads still waiting after 20 s", c.uncommitted.len())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A commit the fencing refuses after the payload was put (the lease's
// deadline passed during the write) leaves no payload behind once its
// computing record has expired: no record names it, and a store that
// lists nothing (Mooncake) would keep it.
func TestARefusedCommitsPayloadIsRemoved(t *testing.T) {
	srv := startServer(t)
	clock := fakeclock.New(time.Now())
	store := payload.NewMemoryStore("test-node", 0)
	c := newCache(t, srv.ClientURL(), slowPut{store, clock, 2 * time.Second},
		WithLeaseTTL(time.Second), WithClock(clock))
	ctx := context.Background()
	commitPastItsLease(t, c, 1)
	if cur, err := c.bucket().Read(ctx, ref(1).KVKey()); err != nil || !cur.Live || cur.Record.State != lease.StateComputing {
		t.Fatalf("the key's record: %+v %v, want its (refused) computing record", cur, err)
	}
	settleUncommitted(t, c)
	if n := store.Bytes(); n != 0 {
		t.Fatalf("%d bytes left in the store after a refused commit", n)
	}
	if s := c.Stats(); s.UncommittedDeleted != 1 || s.UncommittedLeft != 0 {
		t.Fatalf("uncommitted deleted %d, left %d; want 1, 0", s.UncommittedDeleted, s.UncommittedLeft)
	}
}

// A commit that landed although its answer came too late to trust is the
// record's: its payload stays, named.
func TestALateCommitsPayloadStays(t *testing.T) {
	lt := newLeaseTest(t)
	store := lt.c.router.Writer().(*payload.MemoryStore)
	ctx := context.Background()
	res, err := lt.c.Reserve(ctx, ref(2))
	if err != nil {
		t.Fatal(err)
	}
	lt.onNext("write", func(err error) error { lt.clock.Advance(longLease); return err })
	if _, err := res.Commit(ctx, embedding(2)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("late commit: %v, want ErrLeaseLost", err)
	}
	settleUncommitted(t, lt.c)
	if store.Bytes() == 0 {
		t.Fatal("the payload of a commit that landed was removed")
	}
	cur := lt.read(t, ref(2).KVKey())
	if v, err := store.Get(ctx, *cur.Record.Location); err != nil {
		t.Fatalf("the committed record's payload: %v", err)
	} else {
		v.Close()
	}
	if s := lt.c.Stats(); s.UncommittedDeleted != 0 {
		t.Fatalf("uncommitted deleted %d, want 0", s.UncommittedDeleted)
	}
}

// A refused commit's payload whose key another process is computing is
// left while that compute may name the same bytes, and stays once it
// has.
func TestARefusedCommitsPayloadStaysForTheNextCompute(t *testing.T) {
	srv := startServer(t)
	clock := fakeclock.New(time.Now())
	store := payload.NewMemoryStore("test-node", 0)
	a := newCache(t, srv.ClientURL(), slowPut{store, clock, 2 * time.Second},
		WithLeaseTTL(time.Second), WithClock(clock))
	b := newCache(t, srv.ClientURL(), store, WithLeaseTTL(time.Second))
	ctx := context.Background()
	res, err := a.Reserve(ctx, ref(3))
	if err != nil {
		t.Fatal(err)
	}
	// a pauses (its clock too): its record expires on the server, and b
	// reserves the key before a's commit is tried.
	res.l.Stop()
	var next *Reservation
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if next, err = b.Reserve(ctx, ref(3)); err == nil {
			break
		}
		if !errors.Is(err, ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("b's reserve: %v", err)
		}
	}
	if _, err := res.Commit(ctx, embedding(3)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a's commit: %v, want ErrLeaseLost", err)
	}
	waiting := a.uncommitted.snapshot()
	if len(waiting) != 1 {
		t.Fatalf("%d uncommitted payloads waiting, want 1", len(waiting))
	}
	if a.removeUncommitted(ctx, waiting[0]) || store.Bytes() == 0 {
		t.Fatal("the payload was removed while another process computed its key")
	}
	if _, err := next.Commit(ctx, embedding(3)); err != nil {
		t.Fatal(err)
	}
	settleUncommitted(t, a)
	if store.Bytes() == 0 {
		t.Fatal("the payload b committed was removed")
	}
	if s := a.Stats(); s.UncommittedDeleted != 0 || s.UncommittedLeft != 0 {
		t.Fatalf("a: uncommitted deleted %d, left %d; want 0, 0", s.UncommittedDeleted, s.UncommittedLeft)
	}
}

// commitPastItsLease reserves ref(n) on c and commits it, and requires
// the commit to be refused: c's payload puts outlast its lease (slowPut).
func commitPastItsLease(t *testing.T, c *Cache, n int) {
	t.Helper()
	ctx := context.Background()
	res, err := c.Reserve(ctx, ref(n))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.Commit(ctx, embedding(n)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("commit after the deadline passed in the put: %v, want ErrLeaseLost", err)
	}
}
