package reconciler

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/decodestats"
	"github.com/embcache/embcache/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// active reconciles until the lease is lost or ctx ends. It keeps nothing
// per value: what it needs of a value it reads from the stream when it
// needs it (events.Latest), so its memory grows with the work in hand,
// not with the records. It follows the bucket from since (as far as the
// previous active one's loop got: resumeFrom): the markers placed
// meanwhile are still in the bucket if that is less than a marker TTL
// ago; otherwise (or since unknown, or a sweep left unfinished) it sweeps
// every value the events know once.
func (r *Reconciler) active(ctx context.Context, b *lease.Bucket, el *lease.Lease, from resumePoint) error {
	since := from.since
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-el.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	evs, err := r.js.Stream(ctx, events.StreamName)
	if err != nil {
		return err
	}
	pub := events.NewPublisher(r.js, events.PublisherOptions{Workers: 1, Queue: 1024, Logger: r.s.logger})
	defer pub.Close(context.Background())
	x := &expirer{r: r, b: b, pub: pub, events: evs}
	// Before the durable consumer is handed anything: it then skips what
	// the stream no longer holds.
	r.checkUnread(ctx, evs)
	work := make(chan func(), 256)
	sub, err := events.Subscribe(ctx, r.js, events.SubscribeOptions{Durable: Durable, Logger: r.s.logger, OnBad: r.tel.EventBad},
		func(e events.Event) error {
			r.tel.EventDecoded(e.Kind)
			if apply := r.handleEvent(ctx, b, x, e); apply != nil {
				return applyOnLoop(ctx, work, apply)
			}
			return nil
		})
	if err != nil {
		return err
	}
	defer sub.Stop()
	sweep := since.IsZero() || r.tooFarBehind(time.Since(since))
	start := since
	if sweep {
		start = time.Now()
	}
	changes, stop, err := watchBucket(ctx, r.js, b, start)
	if err != nil {
		return err
	}
	defer stop()
	// The loop's progress, for a successor, and the sweeps: beside the
	// loop, not before it (a sweep of a million values takes minutes, and
	// the markers placed meanwhile must be read before their own TTL ends
	// them). The loop ends when ctx does, and so do they.
	var beside sync.WaitGroup
	defer beside.Wait()
	marks := newTracker(r, b, func(ctx context.Context) (bool, error) { return r.holds(ctx, b, el) }, start, sweep, from.rev,
		func(ctx context.Context) bool { return r.sweep(ctx, x) })
	marks.floor = from.handled
	beside.Go(func() { marks.run(ctx) })
	beside.Go(func() { r.purgeBadRecords(ctx, x) })
	beside.Go(func() { r.keepLocations(ctx, x) })
	r.spreadLeaders(ctx, b)
	spread := time.NewTicker(spreadEvery)
	defer spread.Stop()
	for {
		select {
		case <-ctx.Done():
			return el.Err()
		case <-spread.C:
			r.spreadLeaders(ctx, b)
		case fn := <-work:
			fn()
		case c := <-changes:
			m := c.msg
			key, _ := lease.KeyOfSubject(m.Subject())
			h := m.Headers()
			switch {
			case !strings.Contains(key, "."): // the election's, or another key of no value
			case h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != "":
				if !r.expireOrRetry(ctx, x, key, lease.PurgeCause(m.Data())) && ctx.Err() == nil {
					marks.owe() // a sweep finds the value: its record is gone
				}
			default:
				if _, err := lease.DecodeRecord(key, m.Data()); err != nil {
					r.tel.RecordBad(err, decodestats.OpWatch)
					x.bad.add(key) // purged once old, if nobody writes the key again
				}
			}
			if ctx.Err() == nil {
				// Handled in full: one cut short by the step-down (a read
				// refused as canceled) is its successor's to handle.
				marks.done(c.shard, m)
			}
		}
	}
}

// handleEvent returns what the active reconciler does of event e, to run
// on its loop; nil for an event it does not act on.
func (r *Reconciler) handleEvent(ctx context.Context, b *lease.Bucket, x *expirer, e events.Event) (apply func() error) {
	switch e.Kind {
	case events.KindTouched:
		return func() error { r.applyTouch(ctx, b, e); return nil }
	case events.KindInvalidated:
		return func() error { return r.applyInvalidation(ctx, x, e) }
	}
	return nil
}

// applyOnLoop hands apply to the loop and waits for it. An event is
// acknowledged once applied, not once queued: a reconciler that steps
// down with it queued hands it back, and its successor, which resumes the
// durable consumer, applies it (both apply again harmlessly). An error is
// an event handed back, applied again in a second; so is one whose apply
// the step-down may have cut short.
func applyOnLoop(ctx context.Context, work chan<- func(), apply func() error) error {
	var err error // apply's: set before applied is closed
	applied := make(chan struct{})
	select {
	case work <- func() { err = apply(); close(applied) }:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-applied:
		if err != nil {
			return err
		}
	case <-ctx.Done():
	}
	return ctx.Err()
}

// watchBucket delivers every message of the bucket's shards' streams from
// start on, in order within each shard (an ordered consumer per shard,
// which resumes where it was after a stall or a leader change), until
// stop.
func watchBucket(ctx context.Context, js jetstream.JetStream, b *lease.Bucket, start time.Time) (<-chan shardMsg, func(), error) {
	ch := make(chan shardMsg, 256)
	quit := make(chan struct{}) // closed by stop: a handler waiting on ch gives up
	var running []jetstream.ConsumeContext
	stop := func() {
		close(quit)
		for _, cc := range running {
			cc.Stop()
			<-cc.Closed()
		}
	}
	for shard, kv := range b.Shards() {
		cons, err := js.OrderedConsumer(ctx, "KV_"+kv.Bucket(), jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start})
		if err != nil {
			stop()
			return nil, nil, err
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			select {
			case ch <- shardMsg{shard, m}:
			case <-quit:
			}
		})
		if err != nil {
			stop()
			return nil, nil, err
		}
		running = append(running, cc)
	}
	return ch, stop, nil
}

// shardMsg is a message of one of the bucket's shards' streams.
type shardMsg struct {
	shard int
	msg   jetstream.Msg
}

// read reads key, counting a record that does not decode.
func (r *Reconciler) read(ctx context.Context, b *lease.Bucket, key string) (lease.Entry, error) {
	cur, err := b.Read(ctx, key)
	if errors.Is(err, lease.ErrBadRecord) {
		r.tel.RecordBad(err, decodestats.OpRead)
	}
	return cur, err
}
