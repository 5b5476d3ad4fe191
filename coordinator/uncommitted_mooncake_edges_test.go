//go:build mooncake && cgo

package coordinator

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/fakeclock"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/mooncake"
)

// gatedMooncake is A's transport over a real Mooncake Store: its first Put
// takes so long that the lease's deadline passes (a refused commit), and
// the uncommitted removal's tries after its first wait for gate.
type gatedMooncake struct {
	*mooncake.Store
	clock *fakeclock.Clock
	slow  *atomic.Bool
	gens  *atomic.Int32
	gate  chan struct{}
}

func (g gatedMooncake) Put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	loc, err := g.Store.Put(ctx, obj, v)
	if g.slow.CompareAndSwap(true, false) {
		g.clock.Advance(longLease)
	}
	return loc, err
}

func (g gatedMooncake) Generation(ctx context.Context, loc payload.Location) (payload.Generation, error) {
	if g.gens.Add(1) > 1 {
		<-g.gate
	}
	return g.Store.Generation(ctx, loc)
}

// On Mooncake an object is one per key for the whole cluster. A's refused
// commit leaves X; the removal's first try checks X (leasing it: busy).
// A's record expires; B computes the key to other bytes Y (new weights),
// whose Put replaces X, and commits Y. A's next try finds a committed
// record of other bytes: X is gone already, and a Delete (which trusts
// its own check for 2 minutes) would remove B's live Y. It settles
// without one.
func TestMooncakeRemovalLeavesAnotherCommitsOtherBytes(t *testing.T) {
	store := openRealMooncake(t)
	srv := startServer(t)
	clock := fakeclock.New(time.Now())
	slow := &atomic.Bool{}
	slow.Store(true)
	gm := gatedMooncake{store, clock, slow, &atomic.Int32{}, make(chan struct{})}
	gateOpen := false
	a, err := New(context.Background(), connect(t, srv.ClientURL()), route(t, payload.TransportMooncake, gm),
		WithNode("test-node"), WithLeaseTTL(longLease), WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(context.Background(), connect(t, srv.ClientURL()), route(t, payload.TransportMooncake, store),
		WithNode("test-node"), WithLeaseTTL(longLease))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !gateOpen {
			close(gm.gate)
		}
		a.Close()
		b.Close()
	})
	ctx := context.Background()
	commitPastItsLease(t, a, 7)
	// The first try (A's own computing record) checked X and was busy; the
	// second waits at the gate.
	pollUntil(t, "the removal's second try", func() bool { return gm.gens.Load() >= 2 })
	// A's record expires (purged here as its expiry would).
	cur, err := a.bucket().Read(ctx, ref(7).KVKey())
	if err != nil || !cur.Live {
		t.Fatalf("A's record: %+v %v", cur, err)
	}
	if err := a.bucket().Purge(ctx, ref(7).KVKey(), cur.Rev); err != nil {
		t.Fatal(err)
	}
	resB, err := b.Reserve(ctx, ref(7))
	if err != nil {
		t.Fatal(err)
	}
	locB, err := resB.Commit(ctx, embedding(70)) // other bytes
	if err != nil {
		t.Fatal(err)
	}
	close(gm.gate)
	gateOpen = true
	settleUncommitted(t, a)
	if cur, err := b.bucket().Read(ctx, ref(7).KVKey()); err != nil || !cur.Live || !holds(cur.Record, locB) {
		t.Fatalf("B's committed record: %+v %v", cur, err)
	}
	if v, err := store.Get(ctx, locB); err != nil {
		t.Fatalf("B's live committed object of other bytes after A's uncommitted removal: %v (A: removed %d, left %d)",
			err, a.Stats().UncommittedDeleted, a.Stats().UncommittedLeft)
	} else {
		v.Close()
	}
}
