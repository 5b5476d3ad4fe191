package inspect_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/inspect"
	"github.com/embcache/embcache/internal/natstest"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestKeysRecordAndSummary(t *testing.T) {
	nc := natstest.Conn(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := inspect.Bucket(ctx, nc); err == nil {
		t.Fatal("a bucket before any was created")
	}
	// Three shards: the keys land in 1, 2 and 0 (their first byte mod 3).
	b, err := lease.OpenBucket(ctx, nc, lease.BucketConfig{Name: lease.DefaultBucket, Shards: 3, MarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	beta2, acme9, acme1 := "beta."+strings.Repeat("01", 32), "acme."+strings.Repeat("aa", 32), "acme."+strings.Repeat("03", 32)
	for i, k := range []string{beta2, acme9, acme1} {
		if got := lease.ShardOf(k, 3); got != []int{1, 2, 0}[i] {
			t.Fatalf("%s in shard %d", k, got)
		}
		if _, err := b.KV(k).Put(ctx, k, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := inspect.Bucket(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	if keys, n, err := inspect.Keys(ctx, kv, "", 0); err != nil || n != 3 || !slices.Equal(keys, []string{acme1, acme9, beta2}) {
		t.Fatalf("keys %v %d %v", keys, n, err)
	}
	if keys, n, err := inspect.Keys(ctx, kv, "acme", 0); err != nil || n != 2 || !slices.Equal(keys, []string{acme1, acme9}) {
		t.Fatalf("acme's keys %v %d %v", keys, n, err)
	}
	if keys, n, err := inspect.Keys(ctx, kv, "", 1); err != nil || n != 3 || !slices.Equal(keys, []string{acme1}) {
		t.Fatalf("the first key %v of %d: %v", keys, n, err)
	}
	if v, rev, err := inspect.Record(ctx, kv, beta2); err != nil || string(v) != "{}" || rev != 1 {
		t.Fatalf("record %q at %d: %v", v, rev, err)
	}
	if _, _, err := inspect.Record(ctx, kv, "beta."+strings.Repeat("02", 32)); !errors.Is(err, inspect.ErrNoRecord) {
		t.Fatalf("a missing record: %v", err)
	}

	sum, err := inspect.Summarize(ctx, js, true)
	if !errors.Is(err, inspect.ErrNotCreated) || !strings.Contains(err.Error(), "stream EMBCACHE_EVENTS") || sum.Bucket == nil || sum.Bucket.Values != 3 || sum.Bucket.Shards != 3 || sum.Events != nil || sum.LiveValues != nil {
		t.Fatalf("without the stream: %+v %v", sum, err)
	}
	if _, err := events.EnsureStream(ctx, js, events.StreamConfig{Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	pub := events.NewPublisher(js, events.PublisherOptions{Workers: 1, Queue: 8})
	obj := payload.ObjectID{Tenant: "acme", Key: cachekey.Key{1}}
	loc := payload.Location{Transport: payload.TransportMemory, Node: "n", Object: obj.String(), Size: 64, Checksum: payload.Checksum{2}}
	e := &events.Event{Kind: events.KindPublished, Tenant: "acme", Key: obj.Key, Node: "n", Time: time.Now(),
		Expires: time.Now().Add(time.Hour), Location: &loc}
	err = pub.PublishSync(ctx, e)
	pub.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sum, err = inspect.Summarize(ctx, js, true)
	if err != nil || sum.Events == nil || sum.Events.Messages != 1 || sum.LiveValues == nil || *sum.LiveValues != 1 {
		t.Fatalf("with the stream: %+v %v", sum, err)
	}
	// Without live, the sizes alone: no replay.
	sum, err = inspect.Summarize(ctx, js, false)
	if err != nil || sum.Events == nil || sum.Events.Messages != 1 || sum.LiveValues != nil {
		t.Fatalf("without live: %+v %v", sum, err)
	}

	// A tombstone: a copy in every shard, listed once, a revision in each.
	now := time.Now()
	tomb := lease.Record{V: lease.RecordVersion, State: lease.StateInvalidated, Owner: "test", Started: now, Heartbeat: now, Model: "m", Epoch: 1}
	if err := b.PutTombstone(ctx, "acme", "m", 1, tomb, time.Hour); err != nil {
		t.Fatal(err)
	}
	tk := lease.TombstoneKey("acme", "m", 1)
	if keys, n, err := inspect.Keys(ctx, kv, "acme", 0); err != nil || n != 3 || !slices.Contains(keys, tk) {
		t.Fatalf("acme's keys with a tombstone %v %d %v", keys, n, err)
	}
	if revs, err := inspect.TombstoneRevisions(ctx, kv, tk); err != nil || len(revs) != 3 || slices.Contains(revs, 0) {
		t.Fatalf("the tombstone's revisions %v %v, want one in each of 3 shards", revs, err)
	}
}
