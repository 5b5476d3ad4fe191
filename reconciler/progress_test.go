package reconciler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/reconciler"
)

// heldUpFailover holds r1's loop in value 0's payload delete, lets value 1
// expire behind it, waits until r1's lease renewals alone would say value
// 1's marker was handled, stops r1, calls between, and starts r2.
func heldUpFailover(t *testing.T, between func(e *world)) (e *world, r2 *reconciler.Reconciler, blocked, behind payload.Location) {
	e = newWorld(t)
	blocked = e.commit(0, time.Second)
	d := &blockingDeleter{store: e.store, object: blocked.Object}
	r1, stop1 := e.reconciler(d, reconciler.WithOpTimeout(time.Minute))
	waitFor(t, "r1 active", func() bool { return r1.Stats().Active })
	waitFor(t, "r1's loop held up in a payload delete", d.entered.Load)
	behind = e.commit(1, time.Second)
	waitFor(t, "value 1 expired", func() bool { return !e.record(1).Live })
	expired := time.Now()
	waitFor(t, "r1's lease renewed long after the expiry", func() bool { return e.renewedAfter(expired) })
	stop1()
	if between != nil {
		between(e)
	}
	r2, _ = e.reconciler(e.store)
	waitFor(t, "r2 active", func() bool { return r2.Stats().Active })
	return e, r2, blocked, behind
}

// A reconciler whose loop is held up (a slow payload delete) goes on
// renewing its lease while the bucket's markers wait in its queue. Its
// successor starts where the loop had got to, not where the renewals say
// the process was alive: the markers left are handled. (It started at the
// last renewal less a lease TTL, and the expiry behind the held-up one
// was never announced nor its payload deleted.)
// The held-up value itself, whose delete the step-down cut short, is not
// announced by r1 (announced, it was done for r2, and its payload stayed), so r2 deletes and announces it.
func TestTheMarkersAHeldUpLoopLeftAreHandled(t *testing.T) {
	e, _, blocked, behind := heldUpFailover(t, nil)
	ctx := context.Background()
	for i, loc := range []payload.Location{blocked, behind} {
		waitFor(t, fmt.Sprintf("value %d's eviction announced", i), func() bool { return e.evicted(i) })
		waitFor(t, fmt.Sprintf("value %d's payload deleted", i), func() bool { _, err := e.store.Get(ctx, loc); return err != nil })
	}
}

// A progress record this release does not understand (a newer one's, in
// a rolling upgrade or downgrade) makes the successor sweep: going back to
// the election's renewals would skip what a held-up loop left.
func TestAProgressRecordOfAnotherVersionSweeps(t *testing.T) {
	e, r2, _, _ := heldUpFailover(t, func(e *world) {
		body, _ := json.Marshal(map[string]any{"v": 2, "owner": "newer/reconciler/1", "handled": time.Now()})
		if _, err := e.b.Shards()[0].Put(context.Background(), reconciler.ProgressKey, body); err != nil {
			t.Fatal(err)
		}
	})
	waitFor(t, "value 1's eviction announced", func() bool { return e.evicted(1) })
	waitFor(t, "r2's sweep", func() bool { return r2.Stats().Sweeps == 1 })
}

// A sweep cut short by a failover is done again by the successor: it
// counted as done, and the values it had not reached were never
// announced.
func TestASweepCutShortIsDoneAgain(t *testing.T) {
	e := newWorld(t)
	const n = 20 // more than the sweep's readers, which the deletes hold
	for i := range n {
		e.commit(i, time.Second)
	}
	waitFor(t, "the values expired", func() bool {
		for i := range n {
			if e.record(i).Live {
				return false
			}
		}
		return true
	})
	expired := time.Now()
	// The first reconciler of the bucket: it sweeps, since the markers of
	// the time before it may be gone.
	d := &blockingDeleter{store: e.store, all: true}
	r1, stop1 := e.reconciler(d, reconciler.WithOpTimeout(time.Minute))
	waitFor(t, "r1 active", func() bool { return r1.Stats().Active })
	waitFor(t, "r1's sweep held up in payload deletes", d.entered.Load)
	waitFor(t, "r1's lease renewed long after the expiries", func() bool { return e.renewedAfter(expired) })
	stop1()
	r2, _ := e.reconciler(e.store)
	waitFor(t, "every eviction announced", func() bool {
		for i := range n {
			if !e.evicted(i) {
				return false
			}
		}
		return true
	})
	if r2.Stats().Sweeps != 1 {
		t.Fatalf("r2 swept %d times, want 1", r2.Stats().Sweeps)
	}
}

// progressOf reads the active reconciler's progress record.
func (e *world) progressOf() (handled time.Time, sweeping bool, ok bool) {
	entry, err := e.b.Shards()[0].Get(context.Background(), reconciler.ProgressKey)
	if err != nil {
		return time.Time{}, false, false
	}
	var p struct {
		Handled  time.Time `json:"handled"`
		Sweeping bool      `json:"sweeping"`
	}
	if err := json.Unmarshal(entry.Value(), &p); err != nil {
		e.t.Fatalf("progress record %q: %v", entry.Value(), err)
	}
	return p.Handled, p.Sweeping, true
}

// The active reconciler's mark follows its loop while the bucket is idle
// and busy, and says when its sweep is done; a successor started from it
// follows the markers from there and sweeps nothing.
func TestTheMarkAdvancesAndAFailoverDoesNotSweep(t *testing.T) {
	e := newWorld(t)
	r1, stop1 := e.reconciler(e.store)
	waitFor(t, "r1 active, its sweep done", func() bool { return r1.Stats().Active && r1.Stats().Sweeps == 1 })
	idle := time.Now()
	waitFor(t, "the mark past an idle moment, the sweep recorded as done", func() bool {
		handled, sweeping, ok := e.progressOf()
		return ok && !sweeping && handled.After(idle)
	})
	loc := e.commit(0, time.Second)
	waitFor(t, "value 0 evicted", func() bool { return e.evicted(0) })
	busy := time.Now()
	waitFor(t, "the mark past the eviction", func() bool { handled, _, _ := e.progressOf(); return handled.After(busy) })
	stop1()
	r2, _ := e.reconciler(e.store)
	waitFor(t, "r2 active", func() bool { return r2.Stats().Active })
	took := time.Now()
	waitFor(t, "r2's mark past its start", func() bool { handled, _, _ := e.progressOf(); return handled.After(took) })
	if n := r2.Stats().Sweeps; n != 0 {
		t.Fatalf("r2 swept %d times after a failover from a fresh mark", n)
	}
	if _, err := e.store.Get(context.Background(), loc); err == nil {
		t.Fatal("value 0's payload stayed")
	}
}

// A loop held up for half a marker TTL (the server removes a marker a
// marker TTL after placing it, handled or not) has its values swept: an
// expiry behind the held-up one is announced and its payload deleted
// while the loop is still held up.
func TestALoopFarBehindItsMarkersSweeps(t *testing.T) {
	e := newWorld(t)
	ctx := context.Background()
	blocked := e.commit(0, time.Second)
	d := &blockingDeleter{store: e.store, object: blocked.Object}
	r1, _ := e.reconciler(d, reconciler.WithOpTimeout(time.Minute), reconciler.WithMarkerTTL(4*time.Second))
	waitFor(t, "r1 active, its first sweep done", func() bool { return r1.Stats().Active && r1.Stats().Sweeps == 1 })
	waitFor(t, "r1's loop held up in a payload delete", d.entered.Load)
	loc := e.commit(1, time.Second)
	waitFor(t, "value 1's eviction announced", func() bool { return e.evicted(1) })
	waitFor(t, "value 1's payload deleted", func() bool { _, err := e.store.Get(ctx, loc); return err != nil })
	// By the sweep (counted once published): the loop is still in value
	// 0's delete (its op timeout is a minute), whose eviction it has not
	// published.
	waitFor(t, "value 1's eviction counted", func() bool { return r1.Stats().Expired != 0 })
	if n := r1.Stats().Expired; n != 1 || !d.entered.Load() {
		t.Fatalf("%d evictions announced, want value 1's alone", n)
	}
}
