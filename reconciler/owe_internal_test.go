package reconciler

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A helper's hunt: an eviction the loop gives up while a sweep is running (owe) is
// consumed at the next mark and dropped (t.owed is already true); the
// running sweep may have passed the key before its record went, and
// when it finishes the owe is forgotten: no further sweep, sweeping=false,
// the value is never announced and its payload stays.
func TestHuntAnOweDuringARunningSweepIsDropped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, newReconciler := trackerWorld(t, 1)
	r := newReconciler()
	release := make(chan struct{})
	var calls atomic.Int32
	tr := newTracker(r, b, func(context.Context) (bool, error) { return true, nil }, time.Now(), true, 0,
		func(ctx context.Context) bool {
			if calls.Add(1) == 1 {
				select { // the term's first sweep: long (10^6 values)
				case <-release:
				case <-ctx.Done():
					return false
				}
			}
			return true
		})
	done := make(chan struct{})
	go func() { tr.run(ctx); close(done) }()
	time.Sleep(200 * time.Millisecond)
	tr.owe()                            // the loop gave up an eviction; the sweep already passed the key
	time.Sleep(2500 * time.Millisecond) // a mark or two meanwhile (every 1 s)
	close(release)                      // the first sweep finishes
	time.Sleep(2500 * time.Millisecond)
	cancel()
	<-done
	if n := calls.Load(); n < 2 {
		t.Fatalf("%d sweeps: the eviction given up during the first sweep was never swept", n)
	}
}
