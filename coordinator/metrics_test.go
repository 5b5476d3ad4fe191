package coordinator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// meter is a MeterProvider whose counters a test reads.
type meter struct {
	*sdkmetric.MeterProvider
	reader *sdkmetric.ManualReader
}

func newMeter(t *testing.T) meter {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	return meter{mp, r}
}

// counts returns every int64 sum of the Cache's and the reconciler's scopes, keyed
// name{attr=value,...} with the attributes in order.
func (m meter) counts(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName && sm.Scope.Name != reconciler.ScopeName {
			continue
		}
		for _, mt := range sm.Metrics {
			sum, ok := mt.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				var attrs []string
				for it := dp.Attributes.Iter(); it.Next(); {
					kv := it.Attribute()
					attrs = append(attrs, string(kv.Key)+"="+kv.Value.Emit())
				}
				out[mt.Name+"{"+strings.Join(attrs, ",")+"}"] += dp.Value
			}
		}
	}
	return out
}

// waitCounts waits until every series in want has its value.
func (m meter) waitCounts(t *testing.T, who string, want map[string]int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := m.counts(t)
		missing := []string{}
		for k, v := range want {
			if got[k] != v {
				missing = append(missing, fmt.Sprintf("%s = %d, want %d", k, got[k], v))
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after 20s:\n%s", who, strings.Join(missing, "\n"))
		}
		time.Sleep(10 * time.Millisecond) // polling the counters another goroutine moves
	}
}

// TestJunkIsCounted publishes events and writes lease records that do not
// decode, one per reason: a worker's Cache and the active Reconciler each
// count every event by its reason (and the Cache in Stats), while the good
// event among them is counted as decoded; the reconciler, which watches the
// bucket, counts every record (a worker hears only of keys it waits on); a
// notice that does not decode is counted too. A pull of a payload that is gone
// is a pull error by reason; an invalidation moves the reconciler's
// actions as its Stats count them.
func TestJunkIsCounted(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	mr, mc := newMeter(t), newMeter(t)
	rec, _ := startReconciler(t, srv.ClientURL(), store, reconciler.WithMeterProvider(mr))
	// Its first sweep comes once its consumer and watcher run.
	waitFor(t, func() bool { return rec.Stats().Active && rec.Stats().Sweeps > 0 })
	c := eventCache(t, srv.ClientURL(), store, WithMeterProvider(mc))
	ctx := context.Background()
	js, _ := jetstream.New(connect(t, srv.ClientURL()))

	junkEvents := map[events.BadReason][]byte{
		events.BadTooLarge:  make([]byte, events.MaxEventSize+1),
		events.BadMalformed: []byte("not an event"),
		events.BadVersion:   {0x81, 0xa1, 'v', 99},   // {"v": 99}
		events.BadInvalid:   {0x81, 0xa1, 'v', 0x01}, // {"v": 1}: no kind, tenant, key or time
	}
	for reason, body := range junkEvents {
		// The stream keeps one event per subject: each its own key.
		// Invalidations: what every worker follows.
		if _, err := js.Publish(ctx, "embcache.ev.acme.invalidated."+ref(100+int(reason)).Key.String(), body); err != nil {
			t.Fatal(err)
		}
	}
	goodEvent := &events.Event{Kind: events.KindInvalidated, Tenant: "acme", Key: events.InvalidationKey("other", 1),
		Model: "other", Epoch: 1, Time: time.Now()}
	good, err := events.Encode(goodEvent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, goodEvent.Subject(), good); err != nil {
		t.Fatal(err)
	}

	kv, err := js.KeyValue(ctx, lease.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	junkRecords := map[events.BadReason]string{
		events.BadMalformed: "not a record",
		events.BadVersion:   `{"v":9,"state":"finished"}`,
		events.BadInvalid:   `{"v":1,"state":"computing"}`, // no owner
	}
	for reason, body := range junkRecords {
		if _, err := kv.Put(ctx, ref(200+int(reason)).KVKey(), []byte(body)); err != nil {
			t.Fatalf("%v: %v", reason, err)
		}
	}

	want := map[string]int64{"embcache.events.decoded{kind=invalidated}": 1}
	for r := range junkEvents {
		want["embcache.events.bad{reason="+r.String()+"}"] = 1
	}
	mc.waitCounts(t, "cache", want)
	for r := range junkRecords {
		want["embcache.records.bad{op=watch,reason="+r.String()+"}"] = 1
	}
	mr.waitCounts(t, "reconciler", want)
	if s := c.Stats(); s.EventsBad != 4 || s.EventsDecoded != 1 || s.BadRecordsWatched != 0 || s.BadRecords != 0 {
		t.Fatalf("cache stats %+v", s)
	}
	// A notice to this node that is no event.
	if err := js.Conn().Publish(events.NoticeSubject("acme", "test-node"), []byte("not a notice")); err != nil {
		t.Fatal(err)
	}
	mc.waitCounts(t, "cache", map[string]int64{"embcache.events.bad{reason=malformed}": 2})

	// A read of a junk record is counted as a read, with its reason.
	var cnt counter
	junk := ref(200 + int(events.BadVersion))
	if _, path, err := c.GetOrComputePath(ctx, "r", junk, cnt.fn(3)); err != nil || path != PathDegraded {
		t.Fatal(path, err)
	}
	c.Release("r")
	mc.waitCounts(t, "cache", map[string]int64{"embcache.records.bad{op=read,reason=version}": 1})
	if s := c.Stats(); s.BadRecords != 1 {
		t.Fatalf("bad records read %d, want 1", s.BadRecords)
	}

	// A committed value whose payload is gone: the pull fails, not_found.
	if _, err := c.GetOrCompute(ctx, "w", ref(1), cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	c.Release("w")
	loc := *readRecord(t, c, ref(1)).Record.Location
	removePayload(t, store, loc)
	mb := newMeter(t)
	b := newCache(t, srv.ClientURL(), store, WithMeterProvider(mb))
	if _, path, err := b.GetOrComputePath(ctx, "r", ref(1), cnt.fn(1)); err != nil || path != PathComputed {
		t.Fatal(path, err)
	}
	b.Release("r")
	mb.waitCounts(t, "puller", map[string]int64{"embcache.pull.errors{reason=not_found}": 1, "embcache.pull.errors{reason=corrupt}": 0})

	// An invalidation: the reconciler removes the record and its payload.
	stale := Ref{Tenant: "acme", Key: cachekey.Key{0xee}, Model: "m", Epoch: 7}
	if _, err := c.GetOrCompute(ctx, "w", stale, cnt.fn(2)); err != nil {
		t.Fatal(err)
	}
	c.Release("w")
	if err := c.Invalidate(ctx, "acme", "m", 7); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return rec.Stats().Invalidated == 1 && rec.Stats().PayloadDeletes > 0 })
	// The counters move with Stats (the purge before b's recompute may
	// have expired ref(1) meanwhile: compare, do not predict).
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, got := rec.Stats(), mr.counts(t)
		want := map[string]int64{
			"embcache.reconciler.actions{action=invalidate}":     int64(s.Invalidated),
			"embcache.reconciler.actions{action=delete_payload}": int64(s.PayloadDeletes),
			"embcache.reconciler.actions{action=expire}":         int64(s.Expired),
			"embcache.reconciler.actions{action=extend}":         int64(s.Touches),
			"embcache.reconciler.elections{}":                    1,
			"embcache.reconciler.active{}":                       1,
		}
		same := true
		for k, v := range want {
			same = same && got[k] == v
		}
		if same {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reconciler counters %v, stats %+v", got, s)
		}
		time.Sleep(10 * time.Millisecond) // polling the counters the reconciler moves
	}
}
