package events

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func server(t testing.TB) (*embedded.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := EnsureStream(context.Background(), js, StreamConfig{Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	return srv, nc, js
}

var now = time.Unix(1_800_000_000, 0).UTC()

func key(i byte) cachekey.Key { return cachekey.Key{i, 0xee} }

func published(tenant string, i byte, expires time.Time) *Event {
	loc := payload.Location{Transport: "shm", Node: "n1", Address: "/dev/shm/embcache",
		Object: payload.ObjectID{Tenant: tenant, Key: key(i)}.String(), Size: 128, Checksum: payload.Checksum{i}}
	return &Event{Kind: KindPublished, Tenant: tenant, Key: key(i), Model: "m", Epoch: 1,
		Node: "n1", Time: now, Expires: expires, Location: &loc}
}

func TestEncodeDecode(t *testing.T) {
	for _, e := range []*Event{
		published("acme", 1, now.Add(time.Hour)),
		{Kind: KindEvicted, Tenant: "acme", Key: key(1), Cause: CauseExpired, Time: now},
		{Kind: KindAbandoned, Tenant: "acme", Key: key(2), Reason: "OOM", Time: now},
		{Kind: KindInvalidated, Tenant: "acme", Key: InvalidationKey("m", 3), Model: "m", Epoch: 3, Time: now},
	} {
		b, err := Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Kind != e.Kind || got.Key != e.Key || !got.Time.Equal(e.Time) || got.Subject() != e.Subject() {
			t.Fatalf("round trip: %+v != %+v", got, e)
		}
		tenant, kind, k, err := ParseSubject(e.Subject())
		if err != nil || tenant != e.Tenant || kind != e.Kind || k != e.Key {
			t.Fatalf("subject %s: %v", e.Subject(), err)
		}
	}
	for name, e := range map[string]*Event{
		"no time":     {Kind: KindAbandoned, Tenant: "acme"},
		"kind":        {Kind: 9, Tenant: "acme", Time: now},
		"tenant":      {Kind: KindAbandoned, Tenant: "a.b", Time: now},
		"no location": {Kind: KindPublished, Tenant: "acme", Expires: now, Time: now},
		"no cause":    {Kind: KindEvicted, Tenant: "acme", Time: now},
		// Past the longest store TTL: a year-3000 expiry overflowed the
		// record's TTL, which expired at once.
		"far expiry":   published("acme", 1, now.Add(MaxStoreTTL+time.Second)),
		"invalidation": {Kind: KindInvalidated, Tenant: "acme", Model: "m", Epoch: 3, Key: key(1), Time: now},
	} {
		if _, err := Encode(e); !errors.Is(err, ErrBadEvent) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, garbage := range [][]byte{nil, {0xc1}, []byte("not msgpack"), {0x81, 0xa1, 'v', 0x02}, {0x81, 0xa1, 'v', 0x03}} {
		if _, err := Decode(garbage); !errors.Is(err, ErrBadEvent) {
			t.Errorf("garbage %x: %v", garbage, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	b, _ := Encode(published("acme", 1, now.Add(time.Hour)))
	f.Add(b)
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrBadEvent) {
				t.Fatalf("%v is not ErrBadEvent", err)
			}
			return
		}
		if _, err := Encode(&e); err != nil {
			t.Fatalf("a decoded event does not encode: %v", err)
		}
	})
}

func TestSubscribeFiltersSkipsGarbageAndResumes(t *testing.T) {
	ctx := context.Background()
	_, _, js := server(t)
	pub := NewPublisher(js, PublisherOptions{Workers: 2, Queue: 64})
	defer pub.Close(ctx)
	var mu sync.Mutex
	var got []Event
	seen := make(chan struct{}, 100)
	handle := func(e Event) error {
		mu.Lock()
		got = append(got, e)
		mu.Unlock()
		seen <- struct{}{}
		return nil
	}
	sub, err := Subscribe(ctx, js, SubscribeOptions{Tenants: []string{"acme"}, Kinds: []Kind{KindPublished}, Durable: "test"}, handle)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.PublishSync(ctx, published("acme", 1, now.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	pub.PublishSync(ctx, published("other", 2, now.Add(time.Hour)))                           // other tenant
	pub.PublishSync(ctx, &Event{Kind: KindAbandoned, Tenant: "acme", Key: key(3), Time: now}) // other kind
	if _, err := js.Publish(ctx, "embcache.ev.acme.published."+key(4).String(), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	pub.PublishSync(ctx, published("acme", 5, now.Add(time.Hour)))
	<-seen
	<-seen
	waitUntil(t, func() bool { return sub.Bad() == 1 })
	sub.Stop()
	// Events published while the durable consumer is away are delivered when it comes back.
	pub.PublishSync(ctx, published("acme", 6, now.Add(time.Hour)))
	sub, err = Subscribe(ctx, js, SubscribeOptions{Tenants: []string{"acme"}, Kinds: []Kind{KindPublished}, Durable: "test"}, handle)
	if err != nil {
		t.Fatal(err)
	}
	<-seen
	sub.Stop()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 || got[0].Key != key(1) || got[1].Key != key(5) || got[2].Key != key(6) {
		t.Fatalf("got %d events: %+v", len(got), got)
	}
}

func TestPublisherDropsWhenFullAndCountsErrors(t *testing.T) {
	srv, _, js := server(t)
	srv.Shutdown() // every publish now fails after its timeout: the queue fills
	pub := NewPublisher(js, PublisherOptions{Workers: 1, Queue: 2})
	pub.timeout = 200 * time.Millisecond
	start := time.Now()
	for i := range 10 {
		pub.Publish(published("acme", byte(i), now.Add(time.Hour)))
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Fatalf("Publish blocked the caller for %v", took)
	}
	if s := pub.Stats(); s.Dropped < 7 {
		t.Fatalf("stats %+v: want at least 7 drops", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The first event waits for an acknowledgement that cannot come; the
	// ones queued behind it go to the connection's reconnect buffer, which
	// Close cannot flush: it says so.
	if err := pub.Close(ctx); err == nil || !strings.Contains(err.Error(), "not flushed") {
		t.Fatalf("close with the server down: %v, want a flush error", err)
	}
	s := pub.Stats()
	if s.Errors < 1 || s.Acknowledged != 0 || s.Errors+s.Dropped+s.Published != 10 {
		t.Fatalf("stats after close %+v: the acknowledged event is an error, every event is counted once", s)
	}
	if pub.Publish(published("acme", 1, now)) {
		t.Fatal("publish after close accepted")
	}
}

func TestReplayRebuildsLiveSet(t *testing.T) {
	ctx := context.Background()
	_, _, js := server(t)
	pub := NewPublisher(js, PublisherOptions{Workers: 1, Queue: 64})
	defer pub.Close(ctx)
	running := NewState()
	emit := func(e *Event) {
		t.Helper()
		if err := pub.PublishSync(ctx, e); err != nil {
			t.Fatal(err)
		}
		running.Apply(*e)
	}
	emit(published("acme", 1, now.Add(time.Hour)))
	emit(published("acme", 2, now.Add(time.Hour)))
	emit(published("acme", 3, now.Add(time.Minute)))
	touch := published("acme", 3, now.Add(2*time.Hour))
	touch.Kind = KindTouched
	emit(touch)
	emit(&Event{Kind: KindEvicted, Tenant: "acme", Key: key(2), Cause: CauseExpired, Time: now})
	emit(published("beta", 4, now.Add(time.Hour)))
	emit(&Event{Kind: KindInvalidated, Tenant: "beta", Model: "m", Epoch: 1, Key: InvalidationKey("m", 1), Time: now})
	js.Publish(ctx, "embcache.ev.acme.published."+key(9).String(), []byte{0xc1}) // garbage

	replayed, skipped, err := Replay(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if skipped != 1 {
		t.Fatalf("skipped %d", skipped)
	}
	want, have := running.Live(now), replayed.Live(now)
	if len(want) != 2 || len(have) != len(want) {
		t.Fatalf("live: running %d, replayed %d", len(want), len(have))
	}
	for id, e := range want {
		if h, ok := have[id]; !ok || !h.Expires.Equal(e.Expires) || h.Location != e.Location {
			t.Fatalf("%v: running %+v, replayed %+v", id, e, h)
		}
	}
	// Idempotent: replaying again changes nothing.
	again, _, _ := Replay(ctx, js)
	if len(again.Live(now)) != 2 {
		t.Fatal("second replay differs")
	}
}

// waitUntil waits for a condition another goroutine (a NATS delivery)
// makes true; it fails after 10s.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPublisherCloseFlushes(t *testing.T) {
	_, _, js := server(t)
	pub := NewPublisher(js, PublisherOptions{Workers: 2, Queue: 256})
	for i := range 200 {
		if !pub.Publish(published("acme", byte(i), now.Add(time.Hour))) {
			t.Fatal("dropped with room in the queue")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The first and every AckEvery-th were acknowledged; the stream holds
	// every one (it stores them after Close has flushed them to it).
	if s := pub.Stats(); s.Published != 200 || s.Acknowledged != 4 || s.Dropped != 0 || s.Errors != 0 {
		t.Fatalf("stats after close %+v", s)
	}
	stream, err := js.Stream(ctx, StreamName)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs == 200
	})
}

// BenchmarkPublish: the caller's cost of Publish with room in the queue
// and with a full queue (the server is down, so nothing drains): a drop
// must cost the caller no more than a queued publish.
func BenchmarkPublish(b *testing.B) {
	for _, full := range []bool{false, true} {
		b.Run(map[bool]string{false: "queued", true: "full-queue-drop"}[full], func(b *testing.B) {
			srv, _, js := server(b)
			if full {
				srv.Shutdown()
			}
			var pub *Publisher
			if !full {
				pub = NewPublisher(js, PublisherOptions{Workers: 2, Queue: 1 << 20})
			} else {
				pub = NewPublisher(js, PublisherOptions{Workers: 1, Queue: 1})
				pub.timeout = time.Second
				for range 3 {
					pub.Publish(published("acme", 1, now.Add(time.Hour)))
				}
			}
			e := published("acme", 1, now.Add(time.Hour))
			for b.Loop() {
				pub.Publish(e)
			}
			b.StopTimer()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			pub.Close(ctx)
			cancel()
		})
	}
}

// streamOf is a server's event stream, and emit, which stores an event in
// it.
func streamOf(t *testing.T) (js jetstream.JetStream, s jetstream.Stream, emit func(*Event)) {
	_, _, js = server(t)
	ctx := context.Background()
	s, err := js.Stream(ctx, StreamName)
	if err != nil {
		t.Fatal(err)
	}
	return js, s, func(e *Event) {
		t.Helper()
		b, err := Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, e.Subject(), b); err != nil {
			t.Fatal(err)
		}
	}
}

// Latest reads one value's last events by subject: live after a publish
// or a touch, not after an eviction or an abandon that came later; and
// Scan reads the last event of each subject of the kinds it is asked for.
func TestLatestAndScan(t *testing.T) {
	js, s, emit := streamOf(t)
	ctx := context.Background()
	latest := func(i byte) (Entry, bool, bool) {
		t.Helper()
		e, live, ok, err := Latest(ctx, s, "acme", key(i))
		if err != nil {
			t.Fatal(err)
		}
		return e, live, ok
	}
	if _, _, ok := latest(1); ok {
		t.Fatal("a key without events has an entry")
	}
	emit(published("acme", 1, now.Add(time.Hour)))
	if e, live, ok := latest(1); !ok || !live || e.Location.Checksum != (payload.Checksum{1}) || e.Model != "m" {
		t.Fatalf("after a publish: %+v live %v ok %v", e, live, ok)
	}
	emit(&Event{Kind: KindEvicted, Tenant: "acme", Key: key(1), Cause: CauseExpired, Time: now})
	if _, live, ok := latest(1); !ok || live {
		t.Fatalf("after an eviction: live %v ok %v", live, ok)
	}
	touch := published("acme", 1, now.Add(2*time.Hour))
	touch.Kind = KindTouched
	emit(touch)
	if e, live, _ := latest(1); !live || !e.Expires.Equal(now.Add(2*time.Hour)) {
		t.Fatalf("after a later touch: %+v live %v", e, live)
	}
	emit(&Event{Kind: KindAbandoned, Tenant: "acme", Key: key(1), Reason: "OOM", Time: now})
	if _, live, _ := latest(1); !live {
		t.Fatal("an abandon (a later compute's: it published nothing) ended the value")
	}

	emit(published("acme", 2, now.Add(time.Hour)))
	emit(published("beta", 3, now.Add(time.Hour)))
	var got []string
	skipped, err := Scan(ctx, js, []Kind{KindPublished, KindTouched}, func(e Event) {
		got = append(got, e.Tenant+"/"+e.Kind.String()+"/"+e.Key.String()[:2])
	})
	if err != nil || skipped != 0 {
		t.Fatal(skipped, err)
	}
	want := []string{"acme/published/01", "acme/touched/01", "acme/published/02", "beta/published/03"}
	if !slices.Equal(got, want) {
		t.Fatalf("scan: %v, want %v", got, want)
	}
	if n, err := Scan(ctx, js, []Kind{KindInvalidated}, func(Event) { t.Fatal("an event of no kind asked for") }); err != nil || n != 0 {
		t.Fatal(n, err)
	}
}

// An eviction of an earlier value stored after the next value's publish
// (its process published it late) does not end the next value: the
// reconciler would neither announce that value's expiry nor delete its
// payload. An eviction of other bytes is an earlier value's; one of its
// bytes ends it. An abandon ends no value, made before or after its
// publish: its compute committed nothing, and reserved the key only once
// the value before it was gone (an abandon made within a second after a
// value's publish ended it, and that value's expiry, still to come, was
// never announced). A State (stats --live)
// folding the same events agrees with Latest at every step.
func TestALateEndOfAnEarlierValueDoesNotEndTheNext(t *testing.T) {
	_, s, store := streamOf(t)
	ctx := context.Background()
	st := NewState()
	emit := func(e *Event) { t.Helper(); store(e); st.Apply(*e) }
	live := func() bool {
		t.Helper()
		_, live, ok, err := Latest(ctx, s, "acme", key(1))
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if _, held := st.Get(payload.ObjectID{Tenant: "acme", Key: key(1)}); held != live {
			t.Fatalf("the folded state holds the value: %v; Latest says it is live: %v", held, live)
		}
		return live
	}
	emit(published("acme", 1, now.Add(time.Hour)))
	emit(&Event{Kind: KindAbandoned, Tenant: "acme", Key: key(1), Reason: "OOM", Time: now.Add(-5 * time.Second)})
	if !live() {
		t.Fatal("an abandon of a compute that failed before the value's publish ended the value")
	}
	other := payload.Location{Transport: "shm", Node: "n1", Address: "/dev/shm/embcache",
		Object: payload.ObjectID{Tenant: "acme", Key: key(1)}.String(), Size: 128, Checksum: payload.Checksum{9}}
	emit(&Event{Kind: KindEvicted, Tenant: "acme", Key: key(1), Cause: CauseExpired, Time: now, Location: &other})
	if !live() {
		t.Fatal("an eviction of other bytes ended the value")
	}
	emit(&Event{Kind: KindAbandoned, Tenant: "acme", Key: key(1), Reason: "OOM", Time: now.Add(time.Millisecond)})
	if !live() {
		t.Fatal("an abandon made after the value's publish ended it")
	}
	emit(published("acme", 1, now.Add(time.Hour)))
	mine := published("acme", 1, now).Location
	emit(&Event{Kind: KindEvicted, Tenant: "acme", Key: key(1), Cause: CauseExpired, Time: now, Location: mine})
	if live() {
		t.Fatal("an eviction of the value's bytes did not end it")
	}
}

// A New subscription whose consumer is recreated before its first
// delivery (nats.go's ordered consumer does so after a missed heartbeat,
// a reconnect or a deleted consumer) loses nothing published since it
// started: an event stored while the first consumer could not deliver it
// (paused), which is then deleted, comes through its successor. (With
// DeliverNew the successor started at its own creation and the event was
// lost: TestGarbageEventsAreSkipped missed one so, under load.)
func TestNewSubscriptionLosesNothingToAReset(t *testing.T) {
	ctx := context.Background()
	_, _, js := server(t)
	pub := NewPublisher(js, PublisherOptions{Workers: 2, Queue: 64})
	defer pub.Close(ctx)
	seen := make(chan Event, 10)
	sub, err := Subscribe(ctx, js, SubscribeOptions{Tenants: []string{"acme"}, New: true}, func(e Event) error { seen <- e; return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	first := sub.consumer.CachedInfo().Name
	if _, err := js.PauseConsumer(ctx, StreamName, first, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := pub.PublishSync(ctx, published("acme", 2, now.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, StreamName, first); err != nil {
		t.Fatal(err)
	}
	if e := awaitEvent(t, seen, "the event published before the consumer was recreated"); e.Key != key(2) {
		t.Fatalf("got the event of key %x, want the one published after the subscription", e.Key[:1])
	}
}

// awaitEvent is the next event on ch, or the test fails after 45 s (past
// the 30 s an ordered consumer takes to reset after missed heartbeats).
func awaitEvent(t *testing.T, ch <-chan Event, what string) Event {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(45 * time.Second):
		t.Fatalf("%s never came", what)
		return Event{}
	}
}

// A New subscription outlives its stream deleted and created again before
// its first delivery: it starts at a time, which the new stream's events
// are past, not at a sequence, which the new stream starts again below.
func TestNewSubscriptionOutlivesARecreatedStream(t *testing.T) {
	ctx := context.Background()
	_, _, js := server(t)
	pub := NewPublisher(js, PublisherOptions{Workers: 2, Queue: 64})
	defer pub.Close(ctx)
	for i := range byte(5) {
		if err := pub.PublishSync(ctx, published("acme", 10+i, now.Add(time.Hour))); err != nil {
			t.Fatal(err)
		}
	}
	seen := make(chan Event, 10)
	sub, err := Subscribe(ctx, js, SubscribeOptions{Tenants: []string{"beta"}, New: true}, func(e Event) error { seen <- e; return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	if err := js.DeleteStream(ctx, StreamName); err != nil {
		t.Fatal(err)
	}
	// The server removes the old stream's files after DeleteStream has
	// returned: a create that meets them fails ("error creating store for
	// stream", err_code 10049, once in a fresh clone's make test), and is
	// tried again.
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
		if err == nil {
			break
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10049 || time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	if err := pub.PublishSync(ctx, published("beta", 1, now.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if e := awaitEvent(t, seen, "the new stream's event"); e.Tenant != "beta" || e.Key != key(1) {
		t.Fatalf("got %s/%x", e.Tenant, e.Key[:1])
	}
}

// An event of one key naming another key's payload does not decode: it
// would have that key's copies dropped and its file deleted.
func TestAnEventNamesItsOwnPayload(t *testing.T) {
	e := published("acme", 1, now.Add(time.Hour))
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []payload.ObjectID{{Tenant: "acme", Key: key(2)}, {Tenant: "beta", Key: key(1)}} {
		e := published("acme", 1, now.Add(time.Hour))
		e.Location.Object = obj.String()
		if _, err := Encode(e); !errors.Is(err, ErrBadEvent) {
			t.Errorf("an acme event naming %s: %v", obj, err)
		}
	}
}

// An event a durable subscription's handler returns an error for is not
// acknowledged: the next subscription on the consumer gets it again.
func TestADeclinedEventIsDeliveredAgain(t *testing.T) {
	ctx := context.Background()
	_, _, js := server(t)
	pub := NewPublisher(js, PublisherOptions{Workers: 2, Queue: 64})
	defer pub.Close(ctx)
	declined := make(chan Event, 10)
	opts := SubscribeOptions{Tenants: []string{"acme"}, Durable: "declines"}
	sub, err := Subscribe(ctx, js, opts, func(e Event) error { declined <- e; return errors.New("not now") })
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.PublishSync(ctx, published("acme", 1, now.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	<-declined
	sub.Stop()
	again := make(chan Event, 10)
	sub, err = Subscribe(ctx, js, opts, func(e Event) error { again <- e; return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	if e := awaitEvent(t, again, "the declined event, again,"); e.Key != key(1) {
		t.Fatalf("got key %x", e.Key[:1])
	}
}
