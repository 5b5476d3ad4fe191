package reconciler_test

import (
	"context"
	"testing"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/reconciler"
)

// A touch the active reconciler has taken off the durable consumer but
// not yet applied (its loop is busy) when it steps down is not
// acknowledged: its successor, resuming the consumer, applies it. (It was
// acknowledged when queued, and lost: the touched record expired in use.)
func TestATouchQueuedAtAFailoverIsApplied(t *testing.T) {
	e := newWorld(t)
	blocked := e.commit(0, time.Second) // its eviction keeps the loop busy
	d := &blockingDeleter{store: e.store, object: blocked.Object}
	r1, stop1 := e.reconciler(d, reconciler.WithOpTimeout(time.Minute))
	waitFor(t, "r1 active", func() bool { return r1.Stats().Active })
	loc := e.commit(1, 30*time.Second)
	waitFor(t, "r1 busy in a payload delete", d.entered.Load)
	seq := e.publish(&events.Event{Kind: events.KindTouched, Tenant: tenant, Key: keyOf(1), Model: "m", Epoch: 1,
		Node: "w", Time: time.Now(), Expires: time.Now().Add(time.Hour), Location: &loc})
	durable := func() (delivered, acked uint64) {
		c, err := e.js.Consumer(context.Background(), events.StreamName, reconciler.Durable)
		if err != nil {
			return 0, 0
		}
		info, err := c.Info(context.Background())
		if err != nil {
			return 0, 0
		}
		return info.Delivered.Stream, info.AckFloor.Stream
	}
	waitFor(t, "the touch delivered to r1", func() bool { d, _ := durable(); return d >= seq })
	if _, acked := durable(); acked >= seq || r1.Stats().Touches != 0 {
		t.Fatalf("the touch was acknowledged (floor %d) or applied (%d) by a busy reconciler", acked, r1.Stats().Touches)
	}
	stop1()
	r2, _ := e.reconciler(e.store)
	waitFor(t, "the touch applied by r2", func() bool { return r2.Stats().Touches == 1 })
	if cur := e.record(1); !cur.Live || !cur.Record.Expires.After(time.Now().Add(30*time.Minute)) {
		t.Fatalf("the record was not extended: %+v", cur)
	}
}
