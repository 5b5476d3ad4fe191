package coordinator

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats.go/jetstream"
)

// median of the durations.
func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func report(b *testing.B, ours, base []time.Duration, unit string) {
	m, mb := median(ours), median(base)
	b.ReportMetric(float64(m.Microseconds()), "us-"+unit)
	b.ReportMetric(float64(mb.Microseconds()), "us-baseline")
	b.ReportMetric(float64(m)/float64(mb), "x-baseline")
}

var benchKey atomic.Uint64

func freshRef() Ref {
	var k cachekey.Key
	n := benchKey.Add(1)
	for i := range 8 {
		k[i] = byte(n >> (8 * i))
	}
	k[31] = 0xbe
	return Ref{Tenant: "bench", Key: k, Model: "m", Epoch: 1}
}

// BenchmarkMiss: a cluster-wide miss (GetOrCompute of a new key with an
// instant fn and a 4 KiB value: read, reserve, compute, commit) and a bare
// Reserve+Commit, each against two bare KV CAS round trips (create +
// update) on the same server, alternating; medians per op.
func BenchmarkMiss(b *testing.B) {
	srv := startServer(b)
	store := payload.NewMemoryStore("test-node", 0)
	c := newCache(b, srv.ClientURL(), store)
	js, _ := jetstream.New(connect(b, srv.ClientURL()))
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "BARE", Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	value := embedding(1)
	for _, mode := range []string{"GetOrCompute", "ReserveCommit"} {
		b.Run(mode, func(b *testing.B) {
			var ours, base []time.Duration
			for b.Loop() {
				r := freshRef()
				t0 := time.Now()
				if mode == "GetOrCompute" {
					if _, err := c.GetOrCompute(ctx, "bench", r, func(context.Context) (*payload.Value, error) { return value, nil }); err != nil {
						b.Fatal(err)
					}
				} else {
					l, err := c.Reserve(ctx, r)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := l.Commit(ctx, value); err != nil {
						b.Fatal(err)
					}
				}
				ours = append(ours, time.Since(t0))
				c.Release("bench")
				t1 := time.Now()
				rev, err := kv.Create(ctx, r.KVKey(), []byte(`{"state":"computing"}`))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := kv.Update(ctx, r.KVKey(), []byte(`{"state":"committed"}`), rev); err != nil {
					b.Fatal(err)
				}
				base = append(base, time.Since(t1))
			}
			report(b, ours, base, "miss")
		})
	}
}

// BenchmarkWake: from the start of a commit until a waiter in another
// cache has the value, against a bare KV put until its watcher delivery.
func BenchmarkWake(b *testing.B) {
	srv := startServer(b)
	store := payload.NewMemoryStore("test-node", 0)
	holder := newCache(b, srv.ClientURL(), store)
	waiter := newCache(b, srv.ClientURL(), store, WithPollInterval(10*time.Second))
	js, _ := jetstream.New(connect(b, srv.ClientURL()))
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "BARE", Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	value := embedding(2)
	var ours, base []time.Duration
	for b.Loop() {
		r := freshRef()
		l, err := holder.Reserve(ctx, r)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		waits := waiter.Stats().Waits
		go func() {
			waiter.GetOrCompute(ctx, "bench", r, func(context.Context) (*payload.Value, error) { return value, nil })
			got <- time.Now()
		}()
		for waiter.Stats().Waits == waits { // the waiter has read "computing" and waits
			time.Sleep(50 * time.Microsecond)
		}
		commit := time.Now()
		if _, err := l.Commit(ctx, value); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, (<-got).Sub(commit))
		waiter.Release("bench")

		put := time.Now()
		if _, err := kv.Put(ctx, r.KVKey(), []byte("x")); err != nil {
			b.Fatal(err)
		}
		<-w.Updates()
		base = append(base, time.Since(put))
	}
	report(b, ours, base, "wake")
}

// BenchmarkRemoteHit8MiB: a remote hit through shm (read the record, map
// the file, check the trailer) against a bare KV get plus a copy of 8 MiB.
func BenchmarkRemoteHit8MiB(b *testing.B) {
	srv := startServer(b)
	dir := b.TempDir()
	store, err := shm.Open(dir, shm.WithNode("test-node"))
	if err != nil {
		b.Fatal(err)
	}
	writer := newCache(b, srv.ClientURL(), store, shmRoute(b, store))
	ctx := context.Background()
	const size = 8 << 20
	value := payload.NewTensor(cachekey.Uint8, []int64{size}, make([]byte, size))
	r := freshRef()
	if _, err := writer.GetOrCompute(ctx, "w", r, func(context.Context) (*payload.Value, error) { return value, nil }); err != nil {
		b.Fatal(err)
	}
	js, _ := jetstream.New(connect(b, srv.ClientURL()))
	kv, _ := js.KeyValue(ctx, lease.DefaultBucket)
	dst := make([]byte, size)
	var ours, base []time.Duration
	for i := 0; b.Loop(); i++ {
		reader := newCacheNoCleanup(b, srv.ClientURL(), store) // a cold local cache each time
		t0 := time.Now()
		v, path, err := reader.GetOrComputePath(ctx, "r", r, nil)
		if err != nil || path != PathRemoteHit {
			b.Fatal(path, err)
		}
		ours = append(ours, time.Since(t0))
		_ = v.Tensor.Data[size-1]
		reader.Release("r")
		reader.Close()

		t1 := time.Now()
		if _, err := kv.Get(ctx, r.KVKey()); err != nil {
			b.Fatal(err)
		}
		copy(dst, value.Tensor.Data)
		base = append(base, time.Since(t1))
	}
	report(b, ours, base, "hit")
	b.ReportMetric(float64(size)/median(ours).Seconds()/1e9, "GB/s")
}

func newCacheNoCleanup(b *testing.B, url string, store *shm.Store) *Cache {
	c, err := New(context.Background(), connect(b, url), shmRoute(b, store), WithNode("test-node"))
	if err != nil {
		b.Fatal(fmt.Sprint(err))
	}
	return c
}

// BenchmarkRemoteHitTombstoneCheck: what the invalidation check adds to a
// remote hit (docs/protocol.md 4.4): the tombstone's read from the stream
// leader, against the record's own read that every remote hit makes.
func BenchmarkRemoteHitTombstoneCheck(b *testing.B) {
	srv := startServer(b)
	store := payload.NewMemoryStore("test-node", 0)
	c := newCache(b, srv.ClientURL(), store)
	ctx := context.Background()
	r := freshRef()
	if _, err := c.GetOrCompute(ctx, "w", r, func(context.Context) (*payload.Value, error) { return embedding(1), nil }); err != nil {
		b.Fatal(err)
	}
	ls := c.bucket()
	var ours, base []time.Duration
	for b.Loop() {
		t0 := time.Now()
		cur, err := ls.Read(ctx, r.KVKey())
		if err != nil || !cur.Live {
			b.Fatal(cur, err)
		}
		base = append(base, time.Since(t0))
		t1 := time.Now()
		if stale, err := c.invalidatedRecord(ctx, ls, r, cur.Record); err != nil || stale {
			b.Fatal(stale, err)
		}
		ours = append(ours, time.Since(t1))
	}
	report(b, ours, base, "check")
}
