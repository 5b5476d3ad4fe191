package lease

import (
	"errors"

	"github.com/nats-io/nats.go"
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

// Republished reports whether every shard republishes what it stores, so
// that Changes works for every key.
func (b *Bucket) Republished() bool {
	for _, ok := range b.republished {
		if !ok {
			return false
		}
	}
	return true
}

// Changes subscribes to what key's stream stores, for as long as the
// caller waits on it, and sends on the returned channel the key's states
// worth acting on: a committed record, a delete, purge or expiry, or a
// record that does not decode. A computing record (a reservation, a
// heartbeat) says nothing new to a waiter and is not sent. The channel
// holds the latest such change not yet received. Call it before reading
// the key, so a change between the read and the wait is not missed, and
// call the returned function when done.
//
// A change is as good as a read from the stream leader at the moment it
// stored the message: only the leader republishes, and only what it
// stored (a compare-and-set JetStream refused is not republished, unlike
// on the key's own subject, which a core subscriber sees as sent). It
// can be stale by the time it arrives, as a read can. Delivery is core
// NATS, at most once: a waiter polls besides (docs/protocol.md 3.3). Only
// waiters hear about a key, so a process's traffic does not grow with the
// number of processes. ErrNoChanges if key's shard does not republish.
func (b *Bucket) Changes(key string) (<-chan Change, func(), error) {
	if !b.republished[b.shardOf(key)] {
		return nil, func() {}, ErrNoChanges
	}
	ch := make(chan Change, 1)
	sub, err := b.nc.Subscribe(b.StoredSubject(key), func(m *nats.Msg) {
		e, err := entryOf(m, "republished "+key)
		if err != nil && !errors.Is(err, ErrBadRecord) {
			return // not the stream's republish (no sequence): ignored
		}
		if err == nil && e.Live && e.Record.State == StateComputing {
			return
		}
		// The latest change replaces one not yet received; this is the
		// subscription's only sender.
		select {
		case <-ch:
		default:
		}
		ch <- Change{Entry: e, Err: err}
	})
	if err != nil {
		return nil, func() {}, err
	}
	return ch, func() { sub.Unsubscribe() }, nil
}
