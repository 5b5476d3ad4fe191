package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Create writes r under key if the key has no live value, with a per-key
// TTL. It returns the revision; ErrHeld means someone else has the key.
func (b *Bucket) Create(ctx context.Context, key string, r Record, ttl time.Duration) (uint64, error) {
	data, err := r.encode()
	if err != nil {
		return 0, err
	}
	var rev uint64
	err = whileInFlight(ctx, key, func() (err error) {
		rev, err = b.KV(key).Create(ctx, key, data, jetstream.KeyTTL(wholeSeconds(ttl)))
		return err
	})
	if err != nil {
		if isConflict(err) {
			return 0, fmt.Errorf("%w: %s", ErrHeld, key)
		}
		return 0, err
	}
	return rev, nil
}

// CompareAndSet replaces the value at revision rev with r and a new per-key TTL.
// kv.Update would drop the TTL (nats.go #1994), so this publishes to the
// key's subject with the expected-sequence and TTL headers itself.
// ErrLost means rev is no longer the key's revision.
func (b *Bucket) CompareAndSet(ctx context.Context, key string, rev uint64, r Record, ttl time.Duration) (uint64, error) {
	return b.compareAndSetIn(ctx, b.shardOf(key), key, rev, r, ttl)
}

// compareAndSetIn is CompareAndSet in shard. rev 0 means the key has no
// message in it.
func (b *Bucket) compareAndSetIn(ctx context.Context, shard int, key string, rev uint64, r Record, ttl time.Duration) (uint64, error) {
	data, err := r.encode()
	if err != nil {
		return 0, err
	}
	msg := &nats.Msg{Subject: b.subjectIn(shard, key), Data: data}
	var ack *jetstream.PubAck
	err = whileInFlight(ctx, key, func() (err error) {
		ack, err = b.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(wholeSeconds(ttl)))
		return err
	})
	if err != nil {
		if isConflict(err) {
			return 0, fmt.Errorf("%w: %s is past revision %d (%v)", ErrLost, key, rev, err)
		}
		return 0, err
	}
	return ack.Sequence, nil
}

// Purge removes the key if it is still at rev, leaving a marker that
// expires after markerTTL. A key already past rev is ErrLost.
func (b *Bucket) Purge(ctx context.Context, key string, rev uint64) error {
	err := whileInFlight(ctx, key, func() error {
		return b.KV(key).Purge(ctx, key, jetstream.LastRevision(rev), jetstream.PurgeTTL(b.cfg.MarkerTTL))
	})
	if err != nil && isConflict(err) {
		return fmt.Errorf("%w: %s is past revision %d (%v)", ErrLost, key, rev, err)
	}
	return err
}

// Put writes r under key whatever is there, with a per-key TTL, and
// returns the revision.
func (b *Bucket) Put(ctx context.Context, key string, r Record, ttl time.Duration) (uint64, error) {
	return b.putIn(ctx, b.shardOf(key), key, r, ttl)
}

// putIn is Put into shard.
func (b *Bucket) putIn(ctx context.Context, shard int, key string, r Record, ttl time.Duration) (uint64, error) {
	data, err := r.encode()
	if err != nil {
		return 0, err
	}
	msg := &nats.Msg{Subject: b.subjectIn(shard, key), Data: data}
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(wholeSeconds(ttl)))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// PurgeFor is Purge with why in the purge's body, {"cause": "<cause>"}
// (docs/protocol.md 3): the reconciler announces the eviction with that
// cause, and a purge without one (a marker, a plain purge) as expired.
func (b *Bucket) PurgeFor(ctx context.Context, key string, rev uint64, cause events.Cause) error {
	msg := nats.NewMsg(b.Subject(key))
	msg.Header.Set("KV-Operation", "PURGE")
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	msg.Data = []byte(`{"cause":"` + cause.String() + `"}`)
	var opts []jetstream.PublishOpt
	if b.cfg.MarkerTTL > 0 {
		opts = append(opts, jetstream.WithMsgTTL(b.cfg.MarkerTTL))
	}
	err := whileInFlight(ctx, key, func() error {
		_, err := b.js.PublishMsg(ctx, msg, opts...)
		return err
	})
	if err != nil && isConflict(err) {
		return fmt.Errorf("%w: %s is past revision %d (%v)", ErrLost, key, rev, err)
	}
	return err
}

// PurgeCause reads the cause a purge's body names; anything else (an
// expiry marker, a purge without a body) is expired.
func PurgeCause(body []byte) events.Cause {
	var b struct {
		Cause string `json:"cause"`
	}
	if json.Unmarshal(body, &b) == nil {
		for _, c := range []events.Cause{events.CauseInvalidated, events.CauseCorrupt, events.CauseExplicit} {
			if b.Cause == c.String() {
				return c
			}
		}
	}
	return events.CauseExpired
}

// wholeSeconds rounds a TTL up to whole seconds. The server keeps
// per-message TTLs in whole seconds, truncating a fraction (1.9s expires
// after 1s) and refusing less than 1s; rounded up, a message never expires
// before the deadline the writer computed from ttl
// (docs/jetstream-notes.md).
func wholeSeconds(ttl time.Duration) time.Duration {
	return max(time.Second, (ttl + time.Second - 1).Truncate(time.Second))
}

// IsRefusal reports whether err is the server's answer refusing a write
// (an API error): unlike a timeout, it says nothing was stored.
func IsRefusal(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr)
}

// isConflict reports whether err is the server refusing a revision-checked
// write because the key is past the revision: ErrKeyExists,
// ErrKeyRevisionMismatch, or API code 10071. A refusal for another write
// in flight (isInFlight) is not one, and whileInFlight sends it again.
func isConflict(err error) bool {
	if isInFlight(err) {
		return false
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// isInFlight reports whether err is a replicated stream's leader refusing
// a revision-checked write because another write on the same subject is
// proposed and not yet applied (API code 10164; nats-server checks this
// before the revision). Nothing was stored and nothing is said about the
// key: the leader answers a write before it forgets that write's entry,
// so a holder's next write, sent on the answer, can meet its own last one
// (docs/jetstream-notes.md (c)). nats.go's kv.Create wraps it in
// ErrKeyExists.
func isInFlight(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// whileInFlight runs write, and again after a short backoff for as long as
// it is refused for another write in flight on key (isInFlight): that
// write is applied, or dropped by a leader change, within a Raft round,
// and then the revision check answers. At ctx's end the last refusal is
// returned: nothing was stored.
func whileInFlight(ctx context.Context, key string, write func() error) error {
	delay := time.Millisecond
	for {
		err := write()
		if !isInFlight(err) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("lease: %s: another write on it stayed in flight: %w", key, err)
		case <-t.C:
		}
		delay = min(2*delay, 64*time.Millisecond)
	}
}
