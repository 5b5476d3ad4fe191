package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// ProgressKey is the KV key (shard 0, no '.': never a tenant's) where the
// active reconciler records how far its loop has handled the bucket's
// markers and whether a sweep is owed (not finished). Its successor
// starts there: the election's renewals say the process was alive, not
// that its loop kept up (docs/protocol.md 4.6).
const ProgressKey = "_reconciler_progress"

// progressVersion is the version of the progress record this release
// writes and reads; a record of another is not trusted (the successor
// sweeps).
const progressVersion = 1

// progress is the record at ProgressKey.
type progress struct {
	V     int    `json:"v"`
	Owner string `json:"owner"`
	// Handled: every message stored in every shard before it (the stream
	// leaders' time) has been handled.
	Handled time.Time `json:"handled"`
	// Sweeping: a sweep is owed and has not finished; the successor sweeps.
	Sweeping bool `json:"sweeping,omitempty"`
}

// resumePoint is where an active reconciler starts.
type resumePoint struct {
	since   time.Time // where its loop starts following the bucket (zero: it sweeps)
	handled time.Time // the predecessor's mark (zero: none), which its own marks never go below
	rev     uint64    // the progress record's revision (0: none), which its marks replace
}

// resumeFrom is where an active reconciler starts following the bucket.
// It is the predecessor's progress mark less a lease TTL and a
// second: a shard's mark is its leader's time when its position was
// taken, and a replicated stream stamps a message when it is proposed,
// before it counts in the position (a slow commit), and a leader that
// moves may have a clock behind. Zero (sweep) if the predecessor left a
// sweep unfinished, or wrote a record this release does not understand (a
// newer one's: its mark cannot be trusted, and going back to the
// election's renewals would skip what a held-up loop left). Without a
// progress record (the bucket's first reconciler, or one of an earlier
// release), it is the time stamp of the election key's last message (the
// last renewal, or the marker the lease left) less a lease TTL and a
// second, or zero if there is none. A record that cannot be read (a
// shard's leader election) is an error: the campaign waits. The
// predecessor's mark is kept as the floor of this term's: every message
// before it was handled (the margin covers the same uncertain messages
// for every successor), so terms too short to take a mark of their own
// do not move it back by a margin each.
func (r *Reconciler) resumeFrom(ctx context.Context, b *lease.Bucket) (resumePoint, error) {
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	margin := r.s.leaseTTL + time.Second
	e, err := b.Shards()[0].Get(octx, ProgressKey)
	switch {
	case err == nil:
		var p progress
		switch err := json.Unmarshal(e.Value(), &p); {
		case err != nil || p.V != progressVersion || p.Handled.IsZero():
			r.s.logger.Warn("embcache: reconciler progress record not understood, sweeping", "err", err, "v", p.V)
			return resumePoint{rev: e.Revision()}, nil
		case p.Sweeping:
			return resumePoint{rev: e.Revision()}, nil
		default:
			return resumePoint{since: p.Handled.Add(-margin), handled: p.Handled, rev: e.Revision()}, nil
		}
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return resumePoint{}, fmt.Errorf("reconciler: progress record: %w", err)
	}
	prev, err := b.Read(octx, ElectionKey)
	if err != nil {
		return resumePoint{}, fmt.Errorf("reconciler: election key: %w", err)
	}
	if prev.Rev == 0 || prev.Stamp.IsZero() {
		return resumePoint{}, nil
	}
	return resumePoint{since: prev.Stamp.Add(-margin)}, nil
}

// progressEvery is how often the active reconciler takes its progress
// mark: one read of each shard's stream info and one write.
func (r *Reconciler) progressEvery() time.Duration { return max(r.s.leaseTTL/2, time.Second) }

// tooFarBehind reports whether a loop behind the bucket's messages by
// behind may miss some markers: the server removes a marker a marker TTL
// after placing it, handled or not, and a consumer that starts (or lags)
// that close to the end of a marker's life may be handed it after that.
// Such a loop's values are swept, at a term's start or during it.
func (r *Reconciler) tooFarBehind(behind time.Duration) bool { return behind > r.s.markerTTL/2 }

// tracker follows how far the active reconciler's loop has handled each
// shard's messages, writes the mark that follows from it, and runs the
// term's sweeps: the first, if the term starts with one, and one whenever
// the mark falls half a marker TTL behind (the server removes markers a
// marker TTL after it placed them, handled or not: a loop that far behind
// may never see some; a sweep finds their values).
type tracker struct {
	r       *Reconciler
	b       *lease.Bucket
	holds   func(context.Context) (bool, error) // whether this process holds the election, as the bucket says
	start   time.Time                           // where the loop started: what came before was handled by a predecessor (or swept)
	floor   time.Time                           // the predecessor's mark: no mark written goes below it
	handled []atomic.Uint64                     // per shard, the stream sequence of the last message the loop handled
	owes    atomic.Bool                         // set by owe: the loop gave up a marker's eviction
	sweepFn func(context.Context) (done bool)
	ticks   <-chan time.Time // when to take a mark; nil: every progressEvery (a test's own)

	// Read and written by run alone.
	marks   []time.Time  // per shard: every message stored before it was handled (or its value swept)
	pending []checkpoint // per shard: a stream position the loop had not reached when taken
	swept   []uint64     // per shard: a finished sweep covered every message up to this sequence
	rev     uint64       // the progress record's revision, which the next write replaces
	owed    bool         // a sweep is owed: the term's first, or one for a loop behind, not finished yet
	running bool         // a sweep runs
}

// sweepEnd is a sweep's end: when it started, each shard's position
// taken before it started (zero: not read), and whether it finished.
type sweepEnd struct {
	started time.Time
	from    []checkpoint
	done    bool
}

// checkpoint is a shard's last sequence at the stream leader's time at.
type checkpoint struct {
	seq uint64
	at  time.Time
}

// newTracker starts from start, the progress record at revision rev, and
// owes a sweep (sweepFn) if sweep; holds says whether this process still
// holds the election.
func newTracker(r *Reconciler, b *lease.Bucket, holds func(context.Context) (bool, error), start time.Time, sweep bool, rev uint64,
	sweepFn func(context.Context) bool) *tracker {
	n := len(b.Shards())
	t := &tracker{r: r, b: b, holds: holds, start: start, owed: sweep, rev: rev, sweepFn: sweepFn,
		handled: make([]atomic.Uint64, n), marks: make([]time.Time, n), pending: make([]checkpoint, n), swept: make([]uint64, n)}
	for i := range t.marks {
		t.marks[i] = start
	}
	return t
}

// owe records that the loop gave up the eviction of a marker it handled:
// the next mark owes a sweep, which finds the value (its record is gone),
// and says so until it finishes.
func (t *tracker) owe() { t.owes.Store(true) }

// done records that the loop has handled the message m of shard.
func (t *tracker) done(shard int, m jetstream.Msg) {
	if meta, err := m.Metadata(); err == nil {
		t.handled[shard].Store(meta.Sequence.Stream)
	}
}

// run writes the term's first mark at once (its start, and whether it
// owes a sweep: a sweep cut short by this process's end is then seen),
// then one every progressEvery and one when a sweep ends, until another
// process writes marks or ctx ends; then a last one, from what the loop
// has reached of the positions already taken (no stream is read: a
// server that is down holds the end up for one write's timeout at most).
// A sweep owed and not running (the first, one that ended early, one for
// a loop behind) is started at once and at each mark; one that finishes
// moves every shard's mark to its start (sweepDone).
func (t *tracker) run(ctx context.Context) {
	ended := make(chan sweepEnd, 1) // one sweep at a time
	var sweeps sync.WaitGroup
	defer sweeps.Wait()
	// The term's last mark, once ctx has ended (also in the middle of a
	// write), not once the election is another's (its marks are the
	// record's). An eviction given up since the last tick is owed: the
	// successor, starting past it, sweeps.
	defer func() {
		if ctx.Err() == nil {
			return
		}
		last, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.r.s.opTimeout)
		defer cancel()
		t.owed = t.owed || t.owes.Load()
		t.record(last, t.reached())
	}()
	sweep := func() {
		if !t.owed || t.running {
			return
		}
		t.running = true
		started, from := time.Now(), t.positions(ctx)
		sweeps.Go(func() { ended <- sweepEnd{started, from, t.sweepFn(ctx)} })
	}
	sweep()
	if !t.record(ctx, t.start) {
		return
	}
	ticks := t.ticks
	if ticks == nil {
		tick := time.NewTicker(t.r.progressEvery())
		defer tick.Stop()
		ticks = tick.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		case e := <-ended:
			t.running = false
			if e.done {
				t.sweepDone(e)
			} else {
				// Started again at the next tick, not at once: a sweep that
				// fails fast must not loop.
				if !t.record(ctx, t.reached()) {
					return
				}
				continue
			}
		}
		mark := t.mark(ctx)
		if behind := time.Since(mark); t.r.tooFarBehind(behind) && !t.owed {
			t.r.s.logger.Warn("embcache: reconciler behind the bucket's markers by half their TTL, sweeping", "behind", behind)
			t.owed = true
		}
		// Taken only between sweeps: a running one may have read the
		// value's record while it was live.
		if !t.running && t.owes.Swap(false) && !t.owed {
			t.r.s.logger.Warn("embcache: reconciler gave up an eviction, sweeping")
			t.owed = true
		}
		sweep()
		if !t.record(ctx, mark) {
			return
		}
	}
}

// sweepDone records a finished sweep: every value whose record was gone
// before a shard's position was taken (before the sweep read any record)
// has been announced, so the shard's mark moves to that position's time
// (the stream leader's, as every mark; the sweep's start by this
// process's clock where the position was not read), and every message up
// to it counts as handled. A position the loop never reaches (the last
// message of a shard written no more, a marker the server removed before
// the loop was delivered it) held the mark at the sweep's start, and
// every half marker TTL a sweep followed.
func (t *tracker) sweepDone(e sweepEnd) {
	t.owed = false
	for shard, p := range e.from {
		if p.at.IsZero() {
			t.marks[shard] = later(t.marks[shard], e.started)
			continue
		}
		t.marks[shard] = later(t.marks[shard], p.at)
		t.swept[shard] = max(t.swept[shard], p.seq)
	}
	t.reached()
}

// positions is each shard's last stream sequence and the stream leader's
// time (zero where its stream info cannot be read).
func (t *tracker) positions(ctx context.Context) []checkpoint {
	at := make([]checkpoint, len(t.marks))
	for shard := range at {
		if info, err := t.info(ctx, shard); err == nil {
			at[shard] = checkpoint{seq: info.State.LastSeq, at: info.TimeStamp}
		}
	}
	return at
}

// info reads shard's stream info.
func (t *tracker) info(ctx context.Context, shard int) (*jetstream.StreamInfo, error) {
	octx, cancel := context.WithTimeout(ctx, t.r.s.opTimeout)
	defer cancel()
	s, err := t.r.js.Stream(octx, "KV_"+t.b.Shards()[shard].Bucket())
	if err != nil {
		return nil, err
	}
	return s.Info(octx)
}

// handledUpTo is the sequence up to which every message of shard was
// handled by the loop or covered by a finished sweep.
func (t *tracker) handledUpTo(shard int) uint64 { return max(t.handled[shard].Load(), t.swept[shard]) }

// record writes the mark handled, and reports whether the term goes on
// writing. A write refused because the record changed since this term
// last read or wrote it (a predecessor's late mark, a write of its own
// whose answer was lost) is decided by the election: while this process
// holds it, its mark replaces the record; once it does not, its marks
// end (its successor's are the record's). Any other error (a server
// down, an election key that cannot be read) is logged, and the next mark
// tries again.
func (t *tracker) record(ctx context.Context, handled time.Time) bool {
	err := t.write(ctx, handled)
	if err == nil || ctx.Err() != nil {
		return ctx.Err() == nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		t.r.s.logger.Warn("embcache: reconciler progress not recorded", "err", err)
		return true
	}
	switch holds, herr := t.holds(ctx); {
	case herr != nil:
		t.r.s.logger.Warn("embcache: reconciler progress not recorded, the election not read", "err", err, "read", herr)
		return ctx.Err() == nil
	case !holds:
		if ctx.Err() == nil {
			t.r.s.logger.Warn("embcache: reconciler progress written by another process, and the election is not this one's: no more marks this term")
		}
		return false
	}
	octx, cancel := context.WithTimeout(ctx, t.r.s.opTimeout)
	e, gerr := t.b.Shards()[0].Get(octx, ProgressKey)
	cancel()
	if gerr != nil {
		t.r.s.logger.Warn("embcache: reconciler progress not recorded", "err", err, "read", gerr)
		return true
	}
	t.rev = e.Revision()
	if err := t.write(ctx, handled); err != nil && ctx.Err() == nil {
		t.r.s.logger.Warn("embcache: reconciler progress not recorded", "err", err)
	}
	return ctx.Err() == nil
}

// mark advances each shard's mark as far as the loop has handled it and
// returns the earliest. A shard whose last message at the stream leader's
// time was handled (or came before the term's start) is handled up to that
// time; one whose loop is behind keeps its mark until the loop reaches the
// position taken then (so a loop that lags but moves still advances).
func (t *tracker) mark(ctx context.Context) time.Time {
	t.reached()
	for shard := range t.marks {
		if t.pending[shard].seq != 0 {
			continue
		}
		handled := t.handledUpTo(shard)
		info, err := t.info(ctx, shard)
		if err != nil {
			continue
		}
		if st := info.State; st.LastSeq <= handled || st.LastTime.Before(t.start) {
			t.marks[shard] = later(t.marks[shard], info.TimeStamp)
		} else {
			t.pending[shard] = checkpoint{seq: st.LastSeq, at: info.TimeStamp}
		}
	}
	return t.earliest()
}

// reached moves the marks of the shards whose loop has reached the
// position taken, and returns the earliest mark.
func (t *tracker) reached() time.Time {
	for shard, p := range t.pending {
		if p.seq != 0 && t.handledUpTo(shard) >= p.seq {
			t.marks[shard] = later(t.marks[shard], p.at)
			t.pending[shard] = checkpoint{}
		}
	}
	return t.earliest()
}

func (t *tracker) earliest() time.Time {
	earliest := t.marks[0]
	for _, m := range t.marks[1:] {
		if m.Before(earliest) {
			earliest = m
		}
	}
	return earliest
}

// write replaces the progress record (if still at t.rev) with handled,
// and whether the term's sweep is unfinished.
func (t *tracker) write(ctx context.Context, handled time.Time) error {
	body, err := json.Marshal(progress{V: progressVersion, Owner: t.r.id, Handled: later(handled, t.floor), Sweeping: t.owed})
	if err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, t.r.s.opTimeout)
	defer cancel()
	kv := t.b.Shards()[0]
	var rev uint64
	if t.rev == 0 {
		rev, err = kv.Create(octx, ProgressKey, body)
	} else {
		rev, err = kv.Update(octx, ProgressKey, body, t.rev)
	}
	if err != nil {
		return fmt.Errorf("reconciler: progress at revision %d: %w", t.rev, err)
	}
	t.rev = rev
	return nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
