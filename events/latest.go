package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/nats-io/nats.go/jetstream"
)

// The stream keeps the last event of each kind and key (MaxMsgsPerSubject
// 1), so what it says of one value can be read when it is needed, by
// subject, instead of being folded from the whole stream and kept: the
// reconciler's memory then grows with the events it is handling, not with
// the values the cluster holds.

// Latest reads what the stream's last events of tenant's key say of its
// value: the newest published or touched event (its location, model and
// epoch), and whether that value is live in the stream's eyes: no evicted
// or abandoned event came after it. An event that does not decode counts
// as absent. ok is false when the stream has no published or touched event
// of the key.
func Latest(ctx context.Context, s jetstream.Stream, tenant string, key cachekey.Key) (e Entry, live, ok bool, err error) {
	var newest, ended uint64 // stream sequences
	for _, kind := range []Kind{KindPublished, KindTouched, KindEvicted, KindAbandoned} {
		ev := Event{Kind: kind, Tenant: tenant, Key: key}
		m, err := s.GetLastMsgForSubject(ctx, ev.Subject())
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return Entry{}, false, false, fmt.Errorf("events: last %s of %s.%s: %w", kind, tenant, key, err)
		}
		got, derr := Decode(m.Data)
		if derr != nil || got.Kind != kind || got.Tenant != tenant || got.Key != key {
			continue
		}
		switch kind {
		case KindPublished, KindTouched:
			if m.Sequence > newest {
				newest = m.Sequence
				e = Entry{Tenant: tenant, Key: key, Model: got.Model, Epoch: got.Epoch, Location: *got.Location, Expires: got.Expires}
			}
		default:
			ended = max(ended, m.Sequence)
		}
	}
	return e, newest > ended, newest > 0, nil
}

// ScanOptions selects what Scan reads.
type ScanOptions struct {
	Kinds []Kind // only these kinds; empty means all
	// LastPerSubject reads only the last event of each subject (which is
	// every event the stream keeps, since it keeps one per subject; but
	// not the ones a consumer created earlier would still deliver).
	LastPerSubject bool
}

// Scan calls fn with every event the stream holds that opts selects, in
// stream order, up to the last one there at the time of the call, and
// returns how many did not decode (skipped). It holds one batch at a time.
func Scan(ctx context.Context, js jetstream.JetStream, opts ScanOptions, fn func(Event)) (skipped int, err error) {
	stream, err := js.Stream(ctx, StreamName)
	if err != nil {
		return 0, fmt.Errorf("events: scan: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("events: scan: %w", err)
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	last := info.State.LastSeq
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubjects: SubscribeOptions{Kinds: opts.Kinds}.filters()}
	if opts.LastPerSubject {
		cfg.DeliverPolicy = jetstream.DeliverLastPerSubjectPolicy
	}
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("events: scan: %w", err)
	}
	seen, empty := 0, 0
	for done := false; !done; {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			return skipped, fmt.Errorf("events: scan: %w", err)
		}
		n := 0
		// Drain the whole batch even past the end: the fetch ends (and its
		// goroutine with it) when its channel closes.
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if done || err != nil {
				continue
			}
			if e, err := Decode(m.Data()); err != nil {
				skipped++
			} else {
				fn(e)
			}
			done = meta.Sequence.Stream >= last || meta.NumPending == 0
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !done {
			return skipped, fmt.Errorf("events: scan: %w", err)
		}
		seen += n
		if n == 0 {
			empty++
		}
		// Before any event, empty fetches mean the filter matches nothing
		// (pending events are delivered at once); after one, NumPending
		// says when the end is reached.
		if seen == 0 && empty >= 3 {
			done = true
		}
		if ctx.Err() != nil {
			return skipped, ctx.Err()
		}
	}
	return skipped, nil
}
