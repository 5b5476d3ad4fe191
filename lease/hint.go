package lease

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Hints subscribes to key's subject for as long as the caller waits on
// it, and signals on the returned channel when a change may be worth a
// read: a committed record, a delete or purge, or a value that does not
// decode (onBad, if set, is called with its error). A computing record (a
// reservation, a heartbeat) says nothing new to a waiter and is not
// signalled. Call it before reading the key, so a change between the read
// and the wait is not missed, and call the returned function when done.
//
// What it hears is a hint, never a record to trust: a core subscription
// also sees publishes that JetStream refused (a lapsed holder's commit),
// and it does not see the server's own expiry markers. A waiter reads the
// key from the stream leader on a hint, and polls besides
// (docs/protocol.md 3, Wait). Only waiters hear about a key, so a
// process's traffic does not grow with the number of processes.
func (b *Bucket) Hints(key string, onBad func(error)) (<-chan struct{}, func(), error) {
	ch := make(chan struct{}, 1)
	sub, err := b.nc.Subscribe(b.Subject(key), func(m *nats.Msg) {
		if !worthReading(m, onBad) {
			return
		}
		select {
		case ch <- struct{}{}:
		default: // one pending hint is as good as several
		}
	})
	if err != nil {
		return nil, func() {}, err
	}
	return ch, func() { sub.Unsubscribe() }, nil
}

// worthReading reports whether a message on a key's subject may have
// changed what a waiter should do.
func worthReading(m *nats.Msg, onBad func(error)) bool {
	if m.Header.Get("KV-Operation") != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return true // deleted, purged or expired
	}
	rec, err := DecodeRecord(m.Data)
	if err != nil {
		if onBad != nil {
			onBad(err)
		}
		return true
	}
	return rec.State != StateComputing
}
