package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/natstest"
	"github.com/embcache/embcache/lease"
)

// trackerWorld starts a server with a lease bucket of shards shards; new
// makes reconcilers on it (a lease TTL of 1 s, then opts), whose trackers
// the test drives: none is run.
func trackerWorld(t *testing.T, shards int, opts ...Option) (b *lease.Bucket, newReconciler func() *Reconciler) {
	t.Helper()
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv.ClientURL())
	b, err := lease.OpenBucket(context.Background(), nc, lease.BucketConfig{Name: lease.DefaultBucket, MarkerTTL: time.Minute, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	return b, func() *Reconciler {
		t.Helper()
		r, err := New(nc, append([]Option{WithLeaseTTL(time.Second), WithNode("n1")}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
}

// A write of the progress record refused because another process wrote
// it is decided by the election, not by whether it is the term's first:
// the holder's mark replaces a predecessor's late one (its first write
// had failed, or the predecessor's last landed after it), and a process
// that no longer holds the election stops, even on its first write (a
// predecessor stalled past its lease's end). Deciding by first and later
// writes, the holder stopped for its whole term in both cases. An election key that cannot be read leaves the
// question to the next mark (one failed read ended the term's marks).
func TestTheElectionDecidesARefusedMark(t *testing.T) {
	ctx := context.Background()
	b, newReconciler := trackerWorld(t, 1)
	tracker := func(id string, holds func() (bool, error), rev uint64) *tracker {
		r := newReconciler()
		r.id = id
		return newTracker(r, b, func(context.Context) (bool, error) { return holds() }, time.Now().Add(-10*time.Second), false, rev,
			func(context.Context) bool { return true })
	}
	owner := func() string {
		t.Helper()
		e, err := b.Shards()[0].Get(ctx, ProgressKey)
		if err != nil {
			t.Fatal(err)
		}
		var p progress
		if err := json.Unmarshal(e.Value(), &p); err != nil {
			t.Fatal(err)
		}
		return p.Owner
	}
	yes := func() (bool, error) { return true, nil }
	no := func() (bool, error) { return false, nil }
	pred := tracker("pred", no, 0)
	if !pred.record(ctx, pred.start) || owner() != "pred" {
		t.Fatal("the predecessor's mark")
	}
	// The holder read no record (the predecessor's landed after its read):
	// its first write is refused, and replaces the record.
	holder := tracker("holder", yes, 0)
	if !holder.record(ctx, holder.start) || owner() != "holder" {
		t.Fatalf("the holder's first mark: the record is %q's", owner())
	}
	// The predecessor's last write is refused: it stops.
	if pred.record(ctx, time.Now()) || owner() != "holder" {
		t.Fatalf("a predecessor's late mark: the record is %q's", owner())
	}
	// A stalled one's late first write is refused: it stops too.
	stalled := tracker("stalled", no, 0)
	if stalled.record(ctx, stalled.start) || owner() != "holder" {
		t.Fatalf("a stalled first mark: the record is %q's", owner())
	}
	// The holder goes on.
	if !holder.record(ctx, time.Now()) || owner() != "holder" {
		t.Fatal("the holder's next mark")
	}
	// The election key cannot be read once: the mark waits for the next.
	reads := 0
	next := tracker("next", func() (bool, error) {
		if reads++; reads == 1 {
			return false, errors.New("no leader")
		}
		return true, nil
	}, 0)
	if !next.record(ctx, next.start) || owner() != "holder" {
		t.Fatalf("a mark whose election could not be read ended the term or wrote (the record is %q's)", owner())
	}
	if !next.record(ctx, time.Now()) || owner() != "next" {
		t.Fatalf("the mark after the election was read: the record is %q's", owner())
	}
}

// A shard's last message that the loop is never delivered (the server
// removed the marker before the loop was delivered it; here the loop is
// simply told nothing) holds that shard's mark at the last sweep's start.
// A finished sweep covers every message stored before it started: after
// it, the mark follows the shard's stream again. (It stayed at the
// sweep's start until the shard was written again, and every half marker
// TTL a sweep followed.)
func TestASweepCoversAPositionTheLoopNeverReaches(t *testing.T) {
	ctx := context.Background()
	b, newReconciler := trackerWorld(t, 2)
	r := newReconciler()
	start := time.Now()
	tr := newTracker(r, b, func(context.Context) (bool, error) { return true, nil }, start, false, 0, func(context.Context) bool { return true })
	if _, err := b.Shards()[1].Put(ctx, "acme.unseen", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if mark := tr.mark(ctx); !mark.Equal(start) {
		t.Fatalf("mark %v before the loop reached shard 1's message, want the start %v", mark, start)
	}
	sweep := sweepEnd{started: time.Now(), from: tr.positions(ctx), done: true}
	tr.sweepDone(sweep)
	if mark := tr.mark(ctx); !mark.After(sweep.started) {
		t.Fatalf("mark %v after a sweep that covered shard 1's message, want after the sweep's start %v", mark, sweep.started)
	}
}

// An eviction the loop gave up after the last mark, just before the
// term ends, is owed in the term's last mark: the successor, which starts
// past it, sweeps. (The last mark read only the sweeps owed at the ticks,
// and the successor started past the value's marker without a sweep.)
func TestTheLastMarkOwesAGivenUpEviction(t *testing.T) {
	ctx := context.Background()
	// Ticks a minute apart: none comes between the give-up and the end.
	b, newReconciler := trackerWorld(t, 1, WithLeaseTTL(2*time.Minute))
	r := newReconciler()
	tr := newTracker(r, b, func(context.Context) (bool, error) { return true, nil }, time.Now(), false, 0,
		func(context.Context) bool { return true })
	term, end := context.WithCancel(ctx)
	ended := make(chan struct{})
	go func() { tr.run(term); close(ended) }()
	sweeping := func() (bool, bool) {
		e, err := b.Shards()[0].Get(ctx, ProgressKey)
		if err != nil {
			return false, false
		}
		var p progress
		if err := json.Unmarshal(e.Value(), &p); err != nil {
			t.Fatal(err)
		}
		return p.Sweeping, true
	}
	deadline := time.After(20 * time.Second)
	for _, ok := sweeping(); !ok; _, ok = sweeping() {
		select {
		case <-deadline:
			t.Fatal("the term's first mark was not written")
		case <-time.After(10 * time.Millisecond):
		}
	}
	tr.owe()
	end()
	<-ended
	if s, _ := sweeping(); !s {
		t.Fatal("the term's last mark does not owe the eviction given up after the last tick")
	}
}

// A term too short to take a mark of its own writes its predecessor's
// mark, not its own start (the mark less the margin): a row of such terms
// does not move the mark back a margin each, towards a sweep.
func TestAShortTermKeepsItsPredecessorsMark(t *testing.T) {
	ctx := context.Background()
	b, newReconciler := trackerWorld(t, 1)
	r := newReconciler()
	mark := time.Now().Add(-10 * time.Second).UTC().Truncate(time.Millisecond)
	body, err := json.Marshal(progress{V: progressVersion, Owner: "pred", Handled: mark})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Shards()[0].Create(ctx, ProgressKey, body); err != nil {
		t.Fatal(err)
	}
	for term := range 3 {
		from, err := r.resumeFrom(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if margin := r.s.leaseTTL + time.Second; !from.since.Equal(mark.Add(-margin)) || !from.handled.Equal(mark) {
			t.Fatalf("term %d starts at %v with the mark %v; want %v and %v", term, from.since, from.handled, mark.Add(-margin), mark)
		}
		tr := newTracker(r, b, func(context.Context) (bool, error) { return true, nil }, from.since, false, from.rev,
			func(context.Context) bool { return true })
		tr.floor = from.handled
		if !tr.record(ctx, tr.start) { // the term's first mark, and its last
			t.Fatalf("term %d: its mark was not written", term)
		}
	}
}
