package reconciler

import (
	"context"
	"testing"
	"time"
)

// An eviction the loop gives up while a sweep is running (owe) is kept
// until that sweep ends, then swept: the running sweep may have passed the
// key before its record went. (It was consumed at the next mark and
// dropped, the value never announced and its payload left.)
func TestAnOweDuringARunningSweepIsSweptAfterIt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, newReconciler := trackerWorld(t, 1)
	r := newReconciler()
	started := make(chan int, 2) // each sweep's number, as it starts
	release := make(chan struct{})
	calls := 0 // sweeps run one at a time
	tr := newTracker(r, b, func(context.Context) (bool, error) { return true, nil }, time.Now(), true, 0,
		func(ctx context.Context) bool {
			calls++
			started <- calls
			if calls == 1 {
				select { // the term's first sweep: long (10^6 values)
				case <-release:
				case <-ctx.Done():
					return false
				}
			}
			return true
		})
	ticks := make(chan time.Time) // unbuffered: a tick sent after another was taken means that one was handled
	tr.ticks = ticks
	done := make(chan struct{})
	go func() { tr.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if n := <-started; n != 1 {
		t.Fatalf("sweep %d started first", n)
	}
	tr.owe() // the loop gave up an eviction; the sweep already passed the key
	for range 3 {
		ticks <- time.Now() // marks meanwhile
	}
	select {
	case n := <-started:
		t.Fatalf("sweep %d started while the first runs", n)
	default:
	}
	close(release) // the first sweep finishes
	select {
	case <-started: // the owed one
	case <-time.After(10 * time.Second):
		t.Fatal("the eviction given up during the first sweep was never swept")
	}
}
