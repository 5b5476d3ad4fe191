package reconciler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// limit gives the event stream a MaxBytes of n.
func (e *world) limit(n int64) {
	e.t.Helper()
	if _, err := events.EnsureLimits(context.Background(), e.js, events.StreamConfig{MaxBytes: n}, true); err != nil {
		e.t.Fatal(err)
	}
}

// flood publishes n abandoned events of other keys (which neither the
// reconciler's loop nor its sweeps act on), about 400 bytes each stored.
func (e *world) flood(n int) {
	e.t.Helper()
	reason := strings.Repeat("out of memory ", 16)
	for i := range n {
		ev := &events.Event{Kind: events.KindAbandoned, Tenant: "other", Key: keyOf(i), Node: "w", Time: time.Now(), Reason: reason}
		data, err := events.Encode(ev)
		if err != nil {
			e.t.Fatal(err)
		}
		if _, err := e.js.PublishAsync(ev.Subject(), data); err != nil {
			e.t.Fatal(err)
		}
		if i%500 == 499 {
			<-e.js.PublishAsyncComplete()
		}
	}
	<-e.js.PublishAsyncComplete()
}

// latest is what the stream's last events say of key i.
func (e *world) latest(i int) (events.Entry, bool, bool) {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), events.StreamName)
	if err != nil {
		e.t.Fatal(err)
	}
	entry, live, found, err := events.Latest(context.Background(), s, tenant, keyOf(i))
	if err != nil {
		e.t.Fatal(err)
	}
	return entry, live, found
}

func (e *world) streamInfo() *jetstream.StreamInfo {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), events.StreamName)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

// A committed value whose published event was lost (the stream never
// stored it) is found in the bucket: its location is published again from
// its record while it lives, and when it expires its payload is deleted
// and its eviction announced. A value whose event is there gets nothing.
// (Its expiry found no event, and its payload stayed for good: nothing
// but the reconciler removes a Mooncake object; issue 33, item 9.)
func TestALostPublishedEventIsRestoredFromTheBucket(t *testing.T) {
	e := newWorld(t)
	ctx := context.Background()
	lost, _ := e.commitRecord(0, 6*time.Second)
	e.commit(1, time.Hour)
	r, _ := e.reconciler(e.store, reconciler.WithRestoreEvery(300*time.Millisecond))
	waitFor(t, "a restore from the bucket", func() bool { return r.Stats().RestoreSweeps >= 1 })
	if s := r.Stats(); s.Restored != 1 {
		t.Fatalf("%d locations restored, want 1 (value 0's; value 1's event is there)", s.Restored)
	}
	if entry, live, found := e.latest(0); !found || !live || entry.Location != lost {
		t.Fatalf("the stream says of value 0: found %v, live %v, %+v; want its record's location", found, live, entry.Location)
	}
	if _, err := e.store.Get(ctx, lost); err != nil {
		t.Fatalf("the payload of a live record went: %v", err)
	}
	waitFor(t, "value 0's eviction", func() bool { return e.evicted(0) })
	if _, err := e.store.Get(ctx, lost); !errors.Is(err, payload.ErrNotFound) {
		t.Fatalf("value 0 expired and its payload is still there: %v", err)
	}
	if _, err := e.store.Get(ctx, *e.record(1).Record.Location); err != nil {
		t.Fatalf("value 1's payload went: %v", err)
	}
}

// A stream at its MaxBytes that has discarded a live value's published
// event is counted (Stats, the metric, the log), and the value's location
// is published again from its record; the payload stays with its live
// record. (Nothing said the stream discarded anything, and the value's
// expiry would have found no location.)
func TestADiscardingStreamIsCountedAndWhatItLostRestored(t *testing.T) {
	e := newWorld(t)
	e.limit(events.MinMaxBytes)
	loc := e.commit(0, time.Hour)
	e.flood(3000)
	if _, _, found := e.latest(0); found {
		t.Fatal("value 0's published event was not discarded: flood more")
	}
	reader := sdkmetric.NewManualReader()
	r, _ := e.reconciler(e.store, reconciler.WithRestoreEvery(-1), reconciler.WithStreamCheckEvery(time.Hour),
		reconciler.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	waitFor(t, "the restore the discards started", func() bool { return r.Stats().RestoreSweeps >= 1 })
	s := r.Stats()
	if s.DiscardingLive != 1 || s.Restored != 1 {
		t.Fatalf("looks that found live values' events discarded: %d, locations restored %d; want 1, 1", s.DiscardingLive, s.Restored)
	}
	if got := discardsMetric(t, reader, "live"); got != 1 {
		t.Fatalf("embcache.reconciler.stream_discards{what=live} = %d, want 1", got)
	}
	if entry, live, found := e.latest(0); !found || !live || entry.Location != loc {
		t.Fatalf("the stream says of value 0: found %v, live %v", found, live)
	}
	if _, err := e.store.Get(context.Background(), loc); err != nil {
		t.Fatalf("the payload of a live record went: %v", err)
	}
}

// Events the reconciler's durable consumer had not read, discarded by the
// stream at its MaxBytes while no reconciler ran, are counted when the
// next one becomes active.
func TestUnreadEventsDiscardedAreCounted(t *testing.T) {
	e := newWorld(t)
	e.limit(events.MinMaxBytes)
	r1, stop := e.reconciler(e.store)
	waitFor(t, "r1 active", func() bool { return r1.Stats().Active })
	// Its durable consumer made: what the next term finds behind.
	waitFor(t, "r1's consumer", func() bool {
		_, err := e.js.Consumer(context.Background(), events.StreamName, reconciler.Durable)
		return err == nil
	})
	stop()
	e.flood(3000)
	r2, _ := e.reconciler(e.store)
	waitFor(t, "r2 active", func() bool { return r2.Stats().Active })
	waitFor(t, "the unread discards counted", func() bool { return r2.Stats().DiscardedUnread == 1 })
}

// The operator's reconciler gives the stream the MaxBytes it was given;
// a bad one is refused.
func TestTheReconcilerGivesTheStreamItsLimit(t *testing.T) {
	e := newWorld(t)
	if got := e.streamInfo().Config.MaxBytes; got != events.DefaultMaxBytes {
		t.Fatalf("the world's stream holds %d", got)
	}
	r, _ := e.reconciler(e.store, reconciler.WithEventsMaxBytes(3<<20))
	waitFor(t, "active", func() bool { return r.Stats().Active })
	waitFor(t, "the stream's limit", func() bool { return e.streamInfo().Config.MaxBytes == 3<<20 })
}

// discardsMetric is embcache.reconciler.stream_discards{what}.
func discardsMetric(t *testing.T, reader *sdkmetric.ManualReader, what string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "embcache.reconciler.stream_discards" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := dp.Attributes.Value(attribute.Key("what")); v.AsString() == what {
					return dp.Value
				}
			}
		}
	}
	t.Fatalf("no embcache.reconciler.stream_discards{what=%s}", what)
	return 0
}
