package events

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

// bare starts a server with no event stream.
func bare(t testing.TB) jetstream.JetStream {
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
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func streamMaxBytes(t *testing.T, js jetstream.JetStream) int64 {
	t.Helper()
	s, err := js.Stream(context.Background(), StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.Config.MaxBytes
}

// The stream is created with the MaxBytes asked for (the default without
// one); an existing one is returned with its own. (It was 1 GiB whatever
// the cluster's size: issue 33, item 9.)
func TestEnsureStreamTakesItsLimits(t *testing.T) {
	ctx := context.Background()
	js := bare(t)
	if _, err := EnsureStream(ctx, js, StreamConfig{MaxBytes: 3 << 20}); err != nil {
		t.Fatal(err)
	}
	if got := streamMaxBytes(t, js); got != 3<<20 {
		t.Fatalf("created with max bytes %d, want %d", got, 3<<20)
	}
	if _, err := EnsureStream(ctx, js, StreamConfig{MaxBytes: 5 << 20}); err != nil {
		t.Fatal(err)
	}
	if got := streamMaxBytes(t, js); got != 3<<20 {
		t.Fatalf("an existing stream's limit changed to %d by a process that only ensures it", got)
	}
	js = bare(t)
	if _, err := EnsureStream(ctx, js, StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if got := streamMaxBytes(t, js); got != DefaultMaxBytes {
		t.Fatalf("created with max bytes %d, want the default %d", got, DefaultMaxBytes)
	}
}

// A limit out of range is refused, naming what it takes, before anything
// is asked of the server.
func TestAStreamConfigOutOfRangeIsRefused(t *testing.T) {
	ctx := context.Background()
	js := bare(t)
	for _, cfg := range []StreamConfig{{MaxBytes: -1}, {MaxBytes: 1000}, {MaxBytes: MinMaxBytes - 1}, {Replicas: 7}, {Replicas: -1}} {
		_, err := EnsureStream(ctx, js, cfg)
		if !errors.Is(err, ErrInvalidStreamConfig) {
			t.Errorf("%+v: %v, want ErrInvalidStreamConfig", cfg, err)
		}
		if _, err := EnsureLimits(ctx, js, cfg, true); !errors.Is(err, ErrInvalidStreamConfig) {
			t.Errorf("%+v: limits: %v, want ErrInvalidStreamConfig", cfg, err)
		}
	}
	if _, err := js.Stream(ctx, StreamName); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("a refused config created the stream: %v", err)
	}
}

// Only the operator's process (update) changes an existing stream's
// limits; another is told they differ and leaves them. A config that asks
// for no limit changes nothing.
func TestOnlyTheOperatorChangesTheStreamsLimits(t *testing.T) {
	ctx := context.Background()
	js := bare(t)
	if _, err := EnsureStream(ctx, js, StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	want := StreamConfig{MaxBytes: 2 << 20}
	if changed, err := EnsureLimits(ctx, js, want, false); !errors.Is(err, ErrStreamLimits) || changed {
		t.Fatalf("without update: changed %v, %v; want ErrStreamLimits", changed, err)
	}
	if got := streamMaxBytes(t, js); got != DefaultMaxBytes {
		t.Fatalf("changed to %d without update", got)
	}
	if changed, err := EnsureLimits(ctx, js, want, true); err != nil || !changed {
		t.Fatalf("with update: changed %v, %v", changed, err)
	}
	if got := streamMaxBytes(t, js); got != 2<<20 {
		t.Fatalf("max bytes %d after the update, want %d", got, 2<<20)
	}
	if changed, err := EnsureLimits(ctx, js, want, false); err != nil || changed {
		t.Fatalf("limits already right: changed %v, %v", changed, err)
	}
	if changed, err := EnsureLimits(ctx, js, StreamConfig{}, true); err != nil || changed {
		t.Fatalf("no limit asked: changed %v, %v", changed, err)
	}
}

// sizedEvent is a realistic event of kind for key i: a model name, a
// node name and a location as a worker writes them.
func sizedEvent(kind Kind, i int) *Event {
	var k cachekey.Key
	k[0], k[1], k[2], k[31] = byte(i), byte(i>>8), byte(i>>16), 0x77
	t := time.Now()
	const model = "clip-vit-large-patch14"
	if kind == KindInvalidated {
		return &Event{Kind: kind, Tenant: "acme", Key: InvalidationKey(model, uint64(i)), Model: model, Epoch: uint64(i), Node: "node-0042", Time: t}
	}
	loc := payload.Location{Transport: payload.TransportShm, Node: "node-0042", Address: "/dev/shm/embcache",
		Object: payload.ObjectID{Tenant: "acme", Key: k}.String(), Size: 4<<20 + 64, Checksum: payload.Checksum(k)}
	e := &Event{Kind: kind, Tenant: "acme", Key: k, Model: model, Epoch: 3, Node: "node-0042", Time: t, Location: &loc}
	if kind == KindEvicted {
		e.Cause = CauseExpired
	} else {
		e.Expires = t.Add(time.Hour)
	}
	return e
}

// publishAll publishes events, a thousand in flight at most.
func publishAll(t *testing.T, js jetstream.JetStream, n int, event func(i int) *Event) {
	t.Helper()
	for i := range n {
		e := event(i)
		data, err := Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishAsync(e.Subject(), data); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 999 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
}

// perMessage is what the file store adds to each event's subject and
// body (docs/scaling.md's sizing rests on it).
const perMessage = 30

// The bytes the stream holds per event are its subject, its body and 30
// bytes, measured on a real server: docs/scaling.md sizes MaxBytes with
// these figures (published 459, touched 457, evicted 447, invalidated 249
// bytes stored, give or take the few bytes a number's encoding varies by).
func TestStoredBytesPerEvent(t *testing.T) {
	ctx := context.Background()
	js := bare(t)
	s, err := EnsureStream(ctx, js, StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	for kind, want := range map[Kind]uint64{KindPublished: 459, KindTouched: 457, KindEvicted: 447, KindInvalidated: 249} {
		if err := s.Purge(ctx); err != nil {
			t.Fatal(err)
		}
		var framed uint64
		publishAll(t, js, n, func(i int) *Event {
			e := sizedEvent(kind, i)
			data, _ := Encode(e)
			framed += uint64(len(e.Subject()) + len(data) + perMessage)
			return e
		})
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != n || info.State.Bytes != framed {
			t.Errorf("%v: %d events, %d bytes; want %d, %d (subject + body + %d each)", kind, info.State.Msgs, info.State.Bytes, n, framed, perMessage)
		}
		if per := info.State.Bytes / n; per+2 < want || per > want+2 {
			t.Errorf("%v: %d bytes stored per event; docs/scaling.md says %d", kind, per, want)
		}
	}
}

// A stream at its MaxBytes is Discarding (its head goes as events come);
// one below it, by more than an event, is not.
func TestDiscardingSaysWhenTheStreamIsAtItsLimit(t *testing.T) {
	ctx := context.Background()
	js := bare(t)
	s, err := EnsureStream(ctx, js, StreamConfig{MaxBytes: MinMaxBytes})
	if err != nil {
		t.Fatal(err)
	}
	fits := MinMaxBytes / 459
	publishAll(t, js, fits*8/10, func(i int) *Event { return sizedEvent(KindPublished, i) })
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if Discarding(info) || info.State.FirstSeq != 1 {
		t.Fatalf("at %d of %d bytes: discarding %v, first sequence %d", info.State.Bytes, MinMaxBytes, Discarding(info), info.State.FirstSeq)
	}
	publishAll(t, js, fits, func(i int) *Event { return sizedEvent(KindPublished, fits+i) })
	if info, err = s.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if !Discarding(info) || info.State.FirstSeq == 1 {
		t.Fatalf("past its limit (%d of %d bytes, first sequence %d): discarding %v", info.State.Bytes, MinMaxBytes, info.State.FirstSeq, Discarding(info))
	}
	fmt.Fprintf(testWriter{t}, "at the limit: %d of %d bytes, %d events", info.State.Bytes, MinMaxBytes, info.State.Msgs)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
