package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/embcache/embcache/events"
)

// TombstoneKey is the KV key of the invalidation of a tenant's model and
// epoch: <tenant>.inv.<invalidation key>. Its three tokens keep it apart
// from every value's key (<tenant>.<keyhex>).
func TombstoneKey(tenant, model string, epoch uint64) string {
	return tenant + ".inv." + events.InvalidationKey(model, epoch).String()
}

// IsTombstoneKey reports whether a bucket key is a tombstone's
// (<tenant>.inv.<hex>).
func IsTombstoneKey(key string) bool {
	_, rest, _ := strings.Cut(key, ".")
	return strings.HasPrefix(rest, "inv.")
}

// TombstoneTTL is how long a tombstone lives: longer than any record it
// refuses, which expire within a store TTL once nothing extends them, and
// at least as long as the event stream keeps the invalidated event.
// TombstoneTTL(0) is the shortest, whatever the invalidator's store TTL.
func TombstoneTTL(storeTTL time.Duration) time.Duration {
	return max(events.MaxAge, 2*storeTTL)
}

// PutTombstone writes r, the tombstone of tenant's model and epoch, into
// every shard, with the TTL ttl. A record's revisions are its shard's
// sequence, so each shard holds the tombstone its own records are
// compared with (docs/protocol.md 3.4). The shards are written at once,
// so the invalidation costs one write's time whatever their number. It
// holds once every shard has its tombstone: on an error (the first one,
// naming its shard) some may have it and some not, and the caller tries
// again.
//
// Each write is a new revision, whatever is there: a record reserved
// before it is refused. Its Started is the later of r's and that of the
// tombstone it replaces (a compare-and-set on the revision read): two
// invalidations whose writes land in the other order than their clock
// readings leave the later reading, which every reader that heard both
// events compares its tombstone reads with (Invalidated).
func (b *Bucket) PutTombstone(ctx context.Context, tenant, model string, epoch uint64, r Record, ttl time.Duration) error {
	key := TombstoneKey(tenant, model, epoch)
	errs := make([]error, len(b.shards))
	var wg sync.WaitGroup
	for shard := range b.shards {
		wg.Go(func() {
			if err := b.putTombstoneIn(ctx, shard, key, r, ttl); err != nil {
				errs[shard] = fmt.Errorf("lease: tombstone %s in shard %d: %w", key, shard, err)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// tombstoneExpiryMargin: a tombstone read this close to its expiry (this
// process's clock against the server's stamp, and the server's expiry
// late by up to a second or two) may be rolled up by its expiry marker
// after a write on it is acknowledged, since the marker is an
// unconditional write (docs/jetstream-notes.md (a)). A tombstone write
// waits for the marker instead, and writes on its revision.
const tombstoneExpiryMargin = 10 * time.Second

// putTombstoneIn writes r into shard as its tombstone at key, on the
// revision it read, with the later Started of the two; a write that
// another one beat is tried again on what that one left. A tombstone
// that may be expiring is waited out (tombstoneExpiryMargin).
func (b *Bucket) putTombstoneIn(ctx context.Context, shard int, key string, r Record, ttl time.Duration) error {
	delay := time.Millisecond
	for {
		cur, err := b.readIn(ctx, shard, key)
		if err != nil && !errors.Is(err, ErrBadRecord) {
			return err
		}
		if cur.Live && cur.TTL > 0 && !time.Now().Before(cur.Stamp.Add(cur.TTL-tombstoneExpiryMargin)) {
			err = fmt.Errorf("the tombstone at revision %d expires at %v: waiting for its marker", cur.Rev, cur.Stamp.Add(cur.TTL))
			if err := pause(ctx, &delay, err); err != nil {
				return err
			}
			continue
		}
		tomb := r
		if cur.Live && cur.Record.State == StateInvalidated && cur.Record.Started.After(tomb.Started) {
			tomb.Started = cur.Record.Started
		}
		_, err = b.compareAndSetIn(ctx, shard, key, cur.Rev, tomb, ttl)
		if !errors.Is(err, ErrLost) {
			return err
		}
		// Another write landed since the read (or the read lagged: a direct
		// get): read again, after a pause that grows.
		if err := pause(ctx, &delay, err); err != nil {
			return err
		}
	}
}

// pause waits *delay, doubled first (at most 100 ms), or until ctx ends:
// then an error wrapping its cause and why, the reason it waited.
func pause(ctx context.Context, delay *time.Duration, why error) error {
	*delay = min(2**delay, 100*time.Millisecond)
	t := time.NewTimer(*delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w (%v)", context.Cause(ctx), why)
	case <-t.C:
		return nil
	}
}

// Tomb is a tombstone as read: its revision in its shard (0: there is
// none) and when its invalidation was made, its record's Started: the
// invalidated event's Time (Invalidate writes both from one reading of
// its clock), or a later invalidation's of the same labels whose write
// landed first (PutTombstone keeps the later).
type Tomb struct {
	Rev uint64
	At  time.Time
}

// Invalidated reports whether rec, the committed record at key
// (<tenant>.<keyhex>), was reserved before the latest invalidation of its
// model and epoch: the tombstone in key's shard has a later revision than
// rec.Reserved. A tombstone that does not decode (a record of another
// state under its key included) is an error wrapping ErrBadRecord.
//
// heard, if not zero, is the Time of the latest invalidated event of the
// record's labels the caller has heard: a tombstone read that does not
// reflect it (none, or one made before it) was answered by a server that
// has not got that invalidation yet (a lagging or cut-off replica
// answering a direct get, docs/protocol.md 4.4), and is an error wrapping
// ErrTombstoneBehind: the question stays open.
func (b *Bucket) Invalidated(ctx context.Context, key string, rec Record, heard time.Time) (bool, error) {
	tenant, _, _ := strings.Cut(key, ".")
	tomb, err := b.Tombstone(ctx, b.shardOf(key), tenant, rec.Model, rec.Epoch)
	if err != nil {
		return false, err
	}
	if !heard.IsZero() && tomb.At.Before(heard) {
		return false, fmt.Errorf("%w: %s's tombstone of model %q epoch %d read as of %v, an invalidation of %v was heard",
			ErrTombstoneBehind, key, rec.Model, rec.Epoch, tomb.At, heard)
	}
	return tomb.Rev > rec.Reserved, nil
}

// Tombstone returns the tombstone of tenant's model and epoch in shard
// (its Rev 0 if there is none), read from the stream leader (a direct get
// with BucketConfig.Direct: see docs/protocol.md 4.4) by a read sent after
// the call: callers that ask for the same tombstone at once share reads,
// but never one sent before they asked. After Close, a caller that would
// share a read gets an error wrapping ErrClosed.
func (b *Bucket) Tombstone(ctx context.Context, shard int, tenant, model string, epoch uint64) (Tomb, error) {
	if model == "" {
		return Tomb{}, nil // nothing can invalidate it
	}
	if shard < 0 || shard >= len(b.shards) {
		return Tomb{}, fmt.Errorf("lease: no shard %d in a bucket of %d", shard, len(b.shards))
	}
	key := TombstoneKey(tenant, model, epoch)
	return b.tombs.do(ctx, sharedReadID{shard, key}, func(ctx context.Context) (Tomb, error) {
		tomb, err := b.readIn(ctx, shard, key)
		if err != nil {
			return Tomb{}, err
		}
		if !tomb.Live {
			return Tomb{}, nil
		}
		// An invalidated record: nothing else decodes under its key.
		return Tomb{Rev: tomb.Rev, At: tomb.Record.Started}, nil
	})
}
