// Package inspect reads the cluster's state for an operator: the lease
// bucket's keys and records, a summary of the bucket and the event stream,
// and the events as they come (embcache leases, stats, events tail).
package inspect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoRecord is returned by Record for a key the bucket does not hold.
var ErrNoRecord = errors.New("inspect: no such lease or record")

// ErrNotCreated is returned by Summarize, with what it found, when the
// lease bucket or the event stream does not exist.
var ErrNotCreated = errors.New("inspect: not created")

// Bucket binds the lease bucket and its shards.
func Bucket(ctx context.Context, nc *nats.Conn) (*lease.Bucket, error) {
	return lease.BindBucket(ctx, nc, lease.BucketConfig{Name: lease.DefaultBucket})
}

// Keys returns the first limit of the bucket's keys in sorted order, over
// every shard (of one tenant if tenant is not ""; every key if limit is
// 0), and how many there are: it holds at most 2 x limit keys at a time,
// whatever the bucket's size. A tombstone, which every shard holds a copy
// of (docs/protocol.md 3.4), is listed and counted once.
func Keys(ctx context.Context, b *lease.Bucket, tenant string, limit int) (keys []string, total int, err error) {
	filter := ">"
	if tenant != "" {
		filter = tenant + ".>"
	}
	for shard, kv := range b.Shards() {
		lister, err := kv.ListKeysFiltered(ctx, filter)
		if err != nil {
			return nil, 0, err
		}
		for k := range lister.Keys() {
			if shard > 0 && lease.IsTombstoneKey(k) {
				continue // shard 0's copy is listed
			}
			total++
			keys = append(keys, k)
			if limit > 0 && len(keys) >= 2*limit {
				slices.Sort(keys)
				keys = keys[:limit]
			}
		}
	}
	slices.Sort(keys)
	if limit > 0 && len(keys) > limit {
		keys = keys[:limit]
	}
	return keys, total, nil
}

// Record returns the value under key as it is stored (in the key's shard;
// shard 0's copy of a tombstone: see TombstoneRevisions), and its
// revision; ErrNoRecord if there is none. Whether it decodes is
// lease.DecodeRecord's to say.
func Record(ctx context.Context, b *lease.Bucket, key string) ([]byte, uint64, error) {
	e, err := b.KV(key).Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("%w: %s", ErrNoRecord, key)
	}
	if err != nil {
		return nil, 0, err
	}
	return e.Value(), e.Revision(), nil
}

// TombstoneRevisions returns the revision of the tombstone key in each
// shard (0 where a shard has none): a record is compared with its own
// shard's (docs/protocol.md 3.4).
func TombstoneRevisions(ctx context.Context, b *lease.Bucket, key string) ([]uint64, error) {
	var revs []uint64
	for _, kv := range b.Shards() {
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			revs = append(revs, 0)
		case err != nil:
			return nil, err
		default:
			revs = append(revs, e.Revision())
		}
	}
	return revs, nil
}

// Summary is the state of the bucket and the event stream; each part is
// nil when it does not exist.
type Summary struct {
	Bucket *BucketSummary `json:"bucket,omitempty"`
	Events *StreamSummary `json:"events,omitempty"`
	// LiveValues and UndecodableEvents come from a replay of the stream
	// (nil without it): the values it calls live now, and the events it
	// skipped.
	LiveValues        *int `json:"live_values,omitempty"`
	UndecodableEvents *int `json:"undecodable_events,omitempty"`
}

// BucketSummary is the lease bucket's size, over its shards.
type BucketSummary struct {
	Name     string `json:"name"`
	Shards   int    `json:"shards"`
	Values   uint64 `json:"values"`
	Bytes    uint64 `json:"bytes"`
	Replicas int    `json:"replicas"`
}

// StreamSummary is the event stream's size.
type StreamSummary struct {
	Stream   string `json:"stream"`
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
}

// Summarize reads the bucket's and the stream's sizes (a few requests,
// whatever their size) and, with live, replays the stream to count the
// live values: that reads every event and holds every value the stream
// knows, so it takes time and memory in proportion (about a second and
// 200 MB per million values).
func Summarize(ctx context.Context, js jetstream.JetStream, live bool) (Summary, error) {
	var s Summary
	var missing []string
	switch b, err := Bucket(ctx, js.Conn()); {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		missing = append(missing, "bucket "+lease.DefaultBucket)
	case err != nil:
		return s, err // unreachable or too slow: never an empty summary
	default:
		s.Bucket = &BucketSummary{Name: b.Name()}
		for _, kv := range b.Shards() {
			st, err := kv.Status(ctx)
			if err != nil {
				return s, err
			}
			s.Bucket.Shards++
			s.Bucket.Values += st.Values()
			s.Bucket.Bytes += st.Bytes()
			if ks, ok := st.(*jetstream.KeyValueBucketStatus); ok {
				s.Bucket.Replicas = ks.StreamInfo().Config.Replicas
			}
		}
	}
	switch stream, err := js.Stream(ctx, events.StreamName); {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		missing = append(missing, "stream "+events.StreamName)
	case err != nil:
		return s, err
	default:
		info, err := stream.Info(ctx)
		if err != nil {
			return s, err
		}
		s.Events = &StreamSummary{Stream: events.StreamName, Messages: info.State.Msgs, Bytes: info.State.Bytes}
	}
	if len(missing) > 0 {
		return s, fmt.Errorf("%w: %s (has no process connected to this server yet?)", ErrNotCreated, strings.Join(missing, " and "))
	}
	if !live {
		return s, nil
	}
	state, skipped, err := events.Replay(ctx, js)
	if err != nil {
		return s, err
	}
	n := len(state.Live(time.Now()))
	s.LiveValues, s.UndecodableEvents = &n, &skipped
	return s, nil
}

// Tail hands each event the subscription opts selects to print, until ctx
// ends or count (> 0) events were handed over.
func Tail(ctx context.Context, js jetstream.JetStream, opts events.SubscribeOptions, count int, print func(events.Event)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make(chan events.Event, 64)
	sub, err := events.Subscribe(ctx, js, opts, func(e events.Event) error {
		select {
		case out <- e:
		case <-ctx.Done():
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Stop waits for the handler, which may be blocked on a full out: ctx
	// ends first, which it gives up on (with Stop first, `events tail
	// --count 1` hung about one run in five).
	defer func() {
		cancel()
		sub.Stop()
	}()
	for printed := 0; count <= 0 || printed < count; printed++ {
		select {
		case <-ctx.Done():
			return nil
		case e := <-out:
			print(e)
		}
	}
	return nil
}

// EventLine is how an operator reads e as JSON: its fields by name, the
// empty ones left out.
func EventLine(e events.Event) map[string]any {
	line := map[string]any{"kind": e.Kind.String(), "tenant": e.Tenant, "key": e.Key.String(), "node": e.Node, "time": e.Time}
	if e.Model != "" {
		line["model"], line["epoch"] = e.Model, e.Epoch
	}
	if !e.Expires.IsZero() {
		line["expires"] = e.Expires
	}
	if e.Location != nil {
		line["location"] = e.Location
	}
	if e.Cause != 0 {
		line["cause"] = e.Cause.String()
	}
	if e.Reason != "" {
		line["reason"] = e.Reason
	}
	return line
}
