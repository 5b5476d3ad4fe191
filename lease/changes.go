package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// storedPrefix starts the subjects a shard's stream republishes what it
// stores to: embcache.stored.<shard's bucket>.<key>.
const storedPrefix = "embcache.stored."

// A Change is a state of a key as its stream stored it: what a Read at
// that moment would have returned (an Entry, or an Entry and an error
// wrapping ErrBadRecord for a record that does not decode).
type Change struct {
	Entry Entry
	Err   error
}

// StoredSubject is the subject key's stream republishes its stored
// messages to: embcache.stored.<bucket of key's shard>.<key>.
func (b *Bucket) StoredSubject(key string) string {
	return storedPrefix + ShardName(b.cfg.Name, b.shardOf(key)) + "." + key
}

// Changes subscribes to what key's stream stores, for as long as the
// caller waits on it, and sends on the returned channel the key's states
// worth acting on: a committed record, a delete, purge or expiry, or a
// record that does not decode. A computing record (a reservation, a
// heartbeat) says nothing new to a waiter and is not sent. The channel
// holds the newest such change (by revision) not yet received. Call it
// before reading the key, so a change between the read and the wait is
// not missed, and call the returned function when done.
//
// A change is a message the stream stored: only the stream leader
// republishes, and only what it stored, so a compare-and-set JetStream
// refused is never heard (a core subscriber of the key's own subject sees
// it as sent). It may come late, twice, or after a newer one (a new
// leader republishes what it applies of its predecessor's entries), and
// can be stale by the time it is taken, as a read can: a waiter ignores a
// change no newer than what it has read. Delivery is core NATS, at most
// once: a waiter polls besides (docs/protocol.md 3.3). Only waiters hear
// about a key, so a process's traffic does not grow with the number of
// processes. A bucket that does not republish (EnsureRepublish) sends
// nothing.
func (b *Bucket) Changes(key string) (<-chan Change, func(), error) {
	ch := make(chan Change, 1)
	sub, err := b.nc.Subscribe(b.StoredSubject(key), func(m *nats.Msg) {
		if m.Header.Get("Nats-Msg-Size") != "" {
			return // republished without its body (HeadersOnly): the polls read it
		}
		e, err := entryOf(m, key, "republished "+key)
		if err != nil && !errors.Is(err, ErrBadRecord) {
			return // not the stream's republish (no sequence)
		}
		if err == nil && e.Live && e.Record.State == StateComputing {
			return
		}
		// The newest change replaces one not yet received; this is the
		// subscription's only sender, so the send never blocks.
		c := Change{Entry: e, Err: err}
		select {
		case old := <-ch:
			if old.Entry.Rev > c.Entry.Rev {
				c = old
			}
		default:
		}
		ch <- c
	})
	if err != nil {
		return nil, func() {}, err
	}
	return ch, func() { sub.Unsubscribe() }, nil
}

// EnsureRepublish checks that every shard's stream republishes what it
// stores (Changes) and, if update is set, configures a shard of an
// earlier version that does not. Updating a stream is the operator's
// right: a process with a tenant's credentials checks only (a refused
// update would go unanswered until ctx ends). The error, for the first
// shard that does not republish, wraps ErrNoRepublish; a shard that
// republishes elsewhere is not changed. Its waiters then only poll.
func (b *Bucket) EnsureRepublish(ctx context.Context, update bool) error {
	for i := range b.shards {
		name := ShardName(b.cfg.Name, i)
		s, err := b.js.Stream(ctx, "KV_"+name)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", name, err)
		}
		scfg := s.CachedInfo().Config
		want := republish(name)
		switch got := scfg.RePublish; {
		case got != nil && *got == *want:
			continue
		case got != nil:
			return fmt.Errorf("%w: bucket %s republishes %s to %s (headers only: %v), not to %s", ErrNoRepublish,
				name, got.Source, got.Destination, got.HeadersOnly, want.Destination)
		case !update:
			return fmt.Errorf("%w: bucket %s (created by an earlier version)", ErrNoRepublish, name)
		}
		// The whole configuration is written back: a stream update has no
		// revision to check, so an operator's edit at the same moment
		// could be undone (the same update by several processes is not).
		scfg.RePublish = want
		if _, err := b.js.UpdateStream(ctx, scfg); err != nil {
			return fmt.Errorf("%w: bucket %s: %w", ErrNoRepublish, name, err)
		}
	}
	return nil
}

// republish is how the stream of the KV bucket name republishes what it
// stores: every message on $KV.<name>.<key>, once stored, to
// StoredSubject's embcache.stored.<name>.<key>.
func republish(name string) *jetstream.RePublish {
	return &jetstream.RePublish{Source: "$KV." + name + ".>", Destination: storedPrefix + name + ".>"}
}
