package reconciler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

// The reconciler learns where a value's payload is from its published and
// touched events: when the record goes, the bucket's marker carries
// nothing. An event lost (a publish the stream never stored) or
// discarded (the stream at its MaxBytes drops its oldest) would leave the
// payload where it is for good: nothing removes a Mooncake object but the
// reconciler. So the active reconciler watches the stream's state, counts
// what it finds discarded, and reads the committed records themselves
// (restore): a record names its location, and one the stream has no event
// of gets a published event again, from the record, while it lives.

// discard is what a look at the event stream found discarded.
type discard uint8

const (
	// discardLive: the stream is at its MaxBytes and its oldest event is
	// younger than a store TTL (and a touch interval and a marker TTL): it
	// has discarded, or is discarding, events that may be the last a live
	// value has, so its location.
	discardLive discard = iota
	// discardUnread: the stream discarded events the reconciler's durable
	// consumer had not read (it was stopped, or behind): invalidations
	// among them are not applied by it (readers refuse those records by
	// their tombstone, and they expire).
	discardUnread
	numDiscards
)

// String returns the discard's name as the metrics label it.
func (d discard) String() string {
	switch d {
	case discardLive:
		return "live"
	case discardUnread:
		return "unread"
	}
	return fmt.Sprintf("discard(%d)", uint8(d))
}

func (r *Reconciler) discarded(d discard) {
	r.stats.discards[d].Add(1)
	r.tel.discards.Add(context.Background(), 1, discardAttrs[d])
}

// neededFor is how long a live value's last event may be needed: a value
// lives at most a store TTL past its last event, a touch is sent up to a
// quarter of the interval late, and the reconciler reads its event when it
// handles the value's marker (within a marker TTL, or it sweeps).
func (r *Reconciler) neededFor() time.Duration {
	return r.s.storeTTL + r.s.storeTTL/4 + r.s.markerTTL
}

// checkUnread counts, and logs, events the durable consumer had not
// acknowledged that the stream, at its MaxBytes, no longer holds: read
// before the term subscribes (the consumer then moves past them).
// Sequences removed for a newer event of the same subject count too: the
// figure logged is at most what was discarded.
func (r *Reconciler) checkUnread(ctx context.Context, evs jetstream.Stream) {
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	cons, err := evs.Consumer(octx, Durable)
	if err != nil {
		return // none yet (or unreadable: the next term looks again)
	}
	ci, err := cons.Info(octx)
	if err != nil {
		return
	}
	info, err := evs.Info(octx)
	if err != nil {
		return
	}
	first := info.State.FirstSeq
	if !events.Discarding(info) || ci.AckFloor.Stream+1 >= first {
		return
	}
	r.discarded(discardUnread)
	r.s.logger.Warn("embcache: the event stream discarded events the reconciler had not read: invalidations among them are not applied (readers refuse those records by their tombstones); raise its MaxBytes (serve --events-max-bytes)",
		"read_up_to", ci.AckFloor.Stream, "first_held", first, "at_most", first-1-ci.AckFloor.Stream,
		"bytes", info.State.Bytes, "max_bytes", info.Config.MaxBytes)
}

// checkStream reads the event stream's state and reports whether it is
// discarding events a live value may need (discardLive): counted, and
// logged with the MaxBytes that would hold them.
func (r *Reconciler) checkStream(ctx context.Context, evs jetstream.Stream) bool {
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	info, err := evs.Info(octx)
	if err != nil || !events.Discarding(info) {
		return false
	}
	now := info.TimeStamp // the leader's clock, which stamped the events
	if now.IsZero() {
		now = time.Now()
	}
	oldest, needed := now.Sub(info.State.FirstTime), r.neededFor()
	if oldest >= needed {
		return false // what it discards is older than any live value's last event
	}
	r.discarded(discardLive)
	suggest := int64(float64(info.Config.MaxBytes) * needed.Seconds() / max(oldest.Seconds(), 1) * 1.25)
	r.s.logger.Warn("embcache: the event stream is discarding events live values may need (their payloads' locations): raise its MaxBytes (serve --events-max-bytes; docs/scaling.md)",
		"bytes", info.State.Bytes, "max_bytes", info.Config.MaxBytes, "oldest_event_age", oldest.Round(time.Second),
		"needed", needed, "suggested_max_bytes", suggest)
	return true
}

// restoreEvery is the interval of the periodic restores (0: none).
func (r *Reconciler) restoreEvery() time.Duration {
	switch d := r.s.restoreEvery; {
	case d < 0:
		return 0
	case d > 0:
		return d
	}
	return r.s.storeTTL / 2
}

// restoreGap is the least time between two restores a discard starts:
// while the stream is too small, each look finds it discarding.
func (r *Reconciler) restoreGap() time.Duration {
	if d := r.restoreEvery(); d > 0 {
		return min(d, 10*time.Minute)
	}
	return 10 * time.Minute
}

// keepLocations looks at the event stream every checkEvery and restores
// the committed records' locations (restore) every restoreEvery, and at
// once when a look finds the stream discarding events a live value may
// need (at most once per restoreGap), one restore at a time, until ctx
// ends.
func (r *Reconciler) keepLocations(ctx context.Context, x *expirer) {
	var restores sync.WaitGroup
	defer restores.Wait()
	ended := make(chan struct{}, 1) // one restore at a time
	running := false
	var started time.Time
	restore := func() {
		if running {
			return
		}
		running, started = true, time.Now()
		restores.Go(func() {
			r.restore(ctx, x)
			ended <- struct{}{}
		})
	}
	look := func() {
		if r.checkStream(ctx, x.events) && (started.IsZero() || time.Since(started) >= r.restoreGap()) {
			restore()
		}
	}
	check := time.NewTicker(r.s.checkEvery)
	defer check.Stop()
	var periodic <-chan time.Time
	if every := r.restoreEvery(); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		periodic = t.C
	}
	look()
	for {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			look()
		case <-periodic:
			restore()
		case <-ended:
			running = false
		}
	}
}

// committedRecord is a committed record as the bucket's scan read it.
type committedRecord struct {
	key string
	rec lease.Record
}

// restore reads every record of the bucket (each shard's last message per
// key) and, for each committed one, makes sure the event stream says where
// its payload is (restoreOne), sweepReaders at a time; it holds nothing
// of them. It reports whether it finished.
func (r *Reconciler) restore(ctx context.Context, x *expirer) (done bool) {
	work := make(chan committedRecord, sweepReaders)
	var wg sync.WaitGroup
	var restored, unsettled atomic.Int64
	for range sweepReaders {
		wg.Go(func() {
			for c := range work {
				did, settled := x.restoreOne(ctx, c.key, c.rec)
				if did {
					restored.Add(1)
				}
				if !settled {
					unsettled.Add(1)
				}
			}
		})
	}
	var err error
	for _, kv := range x.b.Shards() {
		if err = r.scanCommitted(ctx, kv, work); err != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	if n := restored.Load(); n > 0 {
		r.s.logger.Warn("embcache: committed records whose location the event stream had lost (discarded, or a publish lost), published again from the bucket",
			"values", n)
	}
	switch {
	case ctx.Err() != nil:
	case err != nil:
		r.s.logger.Warn("embcache: restore from the bucket ended early", "err", err)
	case unsettled.Load() > 0:
		r.s.logger.Warn("embcache: restore from the bucket left values unsettled (a read or a publish failed), to the next one", "values", unsettled.Load())
	default:
		r.did(actionRestoreSweep)
		return true
	}
	return false
}

// scanCommitted sends every committed record of kv's stream to work: the
// last message of each key, up to the last one there when it started.
func (r *Reconciler) scanCommitted(ctx context.Context, kv jetstream.KeyValue, work chan<- committedRecord) error {
	name := "KV_" + kv.Bucket()
	stream, err := r.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("reconciler: restore: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("reconciler: restore: %w", err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	last := info.State.LastSeq
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		FilterSubjects: []string{"$KV." + kv.Bucket() + ".>"}})
	if err != nil {
		return fmt.Errorf("reconciler: restore: %w", err)
	}
	done := make(chan struct{})
	finished := false // read and written by the handler alone
	cc, err := cons.Consume(func(m jetstream.Msg) {
		meta, err := m.Metadata()
		if finished || err != nil {
			return
		}
		key, _ := lease.KeyOfSubject(m.Subject())
		h := m.Headers()
		if strings.Contains(key, ".") && h.Get("KV-Operation") == "" && h.Get(jetstream.MarkerReasonHeader) == "" {
			// One that does not decode is the loop's and the sweeps' (bad
			// records): it names no location to trust.
			if rec, err := lease.DecodeRecord(key, m.Data()); err == nil && rec.State == lease.StateCommitted && rec.Location != nil {
				select {
				case work <- committedRecord{key, rec}:
				case <-ctx.Done():
				}
			}
		}
		if meta.Sequence.Stream >= last || meta.NumPending == 0 {
			finished = true
			close(done)
		}
	})
	if err != nil {
		return fmt.Errorf("reconciler: restore: %w", err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	cc.Stop()
	<-cc.Closed()
	return err
}

// restoreOne makes sure the event stream says where the value of the
// committed record rec (as the scan read it) is, and reports whether it
// published that (restored) and whether it settled the value (false: a
// read or the publish failed). The stream says it if the newest published
// or touched event of the key names rec's bytes and no eviction of them
// follows. If not:
//   - the record, read again from the stream leader, still names those
//     bytes: a published event is made from it (the stream now holds its
//     location, and the value's expiry finds it);
//   - the key has no record any more (it went since the scan read it)
//     and the stream never named these bytes: its marker found no
//     location. A published event is made from the scan's copy, and the
//     value is expired at once (expire checks the record again, and
//     deletes no payload a live record names, nor one a compute of the
//     key may be writing);
//   - the key holds another record (committed with other bytes, or
//     computing): nothing is published, since it would take the new
//     value's place as the key's newest event, and the payload's name is
//     the new value's.
//
// A record naming another key's payload restores nothing.
func (x *expirer) restoreOne(ctx context.Context, kvKey string, rec lease.Record) (restored, settled bool) {
	r := x.r
	tenant, hexKey, _ := strings.Cut(kvKey, ".")
	key, err := cachekey.Parse(hexKey)
	if err != nil || !rec.Location.Names(payload.ObjectID{Tenant: tenant, Key: key}) {
		return false, true
	}
	sum := rec.Location.Checksum
	gone, restored, settled := func() (gone, restored, settled bool) {
		mu := &x.keys[key[0]%byte(len(x.keys))]
		mu.Lock()
		defer mu.Unlock()
		octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
		defer cancel()
		entry, live, found, err := events.Latest(octx, x.events, tenant, key)
		if err != nil {
			return false, false, false
		}
		known := found && entry.Location.Checksum == sum
		if known && live {
			return false, false, true
		}
		cur, err := r.read(octx, x.b, kvKey)
		if err != nil {
			return false, false, errors.Is(err, lease.ErrBadRecord) // a bad record is the loop's to purge
		}
		current := cur.Live && cur.Record.State == lease.StateCommitted && cur.Record.Location != nil && cur.Record.Location.Checksum == sum
		switch {
		case current:
			rec = cur.Record
		case known:
			return false, false, true // gone, and the stream knows: its marker (or a sweep) announces it
		case cur.Live:
			// Committed again with other bytes, or being computed again:
			// the payload's name is the new value's (a put of other bytes
			// replaces the old ones), and an event of the old value would
			// take the new one's place as the key's newest.
			return false, false, true
		}
		ev := &events.Event{Kind: events.KindPublished, Tenant: tenant, Key: key, Model: rec.Model, Epoch: rec.Epoch,
			Node: r.s.node, Time: time.Now(), Expires: rec.Expires, Location: rec.Location}
		pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), r.s.opTimeout)
		defer pcancel()
		if err := x.pub.PublishSync(pctx, ev); err != nil {
			r.s.logger.Warn("embcache: a committed record's location not restored: the publish failed", "key", kvKey, "err", err)
			return false, false, false
		}
		r.did(actionRestore)
		return !current, true, true
	}()
	if gone {
		settled = x.expire(ctx, kvKey, events.CauseExpired, nil)
	}
	return restored, settled
}
