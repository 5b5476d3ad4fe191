package agent_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	embnode "github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats.go/jetstream"
)

// pullNode is a node as embcache agent --payload-listen starts it: an shm
// store on tmpfs, served over httppull.
type pullNode struct {
	store   *shm.Store
	cache   *coordinator.Cache
	client  *agent.Client
	payload string // base URL of its payload server
}

func startPullNode(b *testing.B, url, name string, opts ...coordinator.Option) *pullNode {
	b.Helper()
	base := ""
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		base = "/dev/shm" // what production uses: the disk under /tmp writes at another speed
	}
	dir, err := os.MkdirTemp(base, "embcache-pull-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	nn, err := embnode.New(embnode.Options{NATSURL: url, Name: name, ShmDir: filepath.Join(dir, "shm"), PayloadListen: "127.0.0.1:0",
		Strict: true, NoEvents: true, PullToShm: true, Cache: opts})
	if err != nil {
		b.Fatal(err)
	}
	if err := nn.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nn.Close() })
	n := &pullNode{store: nn.Store(), cache: nn.Cache(), payload: "http://" + nn.PayloadAddr()}
	srv, err := agent.New(n.cache, n.store)
	if err != nil {
		b.Fatal(err)
	}
	socket := filepath.Join(dir, "agent.sock")
	ul, err := net.Listen("unix", socket)
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ul)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	n.client = agent.Dial(socket)
	b.Cleanup(n.client.Close)
	return n
}

// BenchmarkRemoteHit: a value committed on node A, looked up through node
// B's agent (B pulls it from A's payload server, verifies it and answers
// its shm file), against a plain httppull Get of the same Location from
// the same server, alternately in the same run. Each iteration commits a
// new key, so every lookup on B is cold. x-plain-get is their ratio.
func BenchmarkRemoteHit(b *testing.B) {
	for _, size := range []int{8 << 20, 100 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			benchRemoteHit(b, size)
		})
	}
}

func benchRemoteHit(b *testing.B, size int) {
	ctx := context.Background()
	srv := startServer(b)
	// b's cache holds one value: the last one leaves it when the next
	// lands, as in an agent that has filled its budget.
	a := startPullNode(b, srv.ClientURL(), "a")
	bn := startPullNode(b, srv.ClientURL(), "b", coordinator.WithLocalCache(localcache.Budget{MaxBytes: int64(size) + 1<<20}))
	nc, err := coordinator.Connect(srv.ClientURL(), coordinator.ModeStrict)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, lease.DefaultBucket)
	if err != nil {
		b.Fatal(err)
	}
	// The plain puller: a transport of its own, as B's coordinator has.
	plain, err := httppull.NewTransport("plain", "http://127.0.0.1:1", payload.NewMemoryStore("plain", 0))
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var tPlain, tAgent time.Duration
	var prev *coordinator.Ref
	i := 0
	for b.Loop() {
		b.StopTimer()
		i++
		key := cachekey.Key{byte(i), byte(i >> 8), byte(size >> 20)}
		ref := coordinator.Ref{Tenant: "acme", Key: key, Model: "m"}
		if _, err := a.cache.GetOrCompute(ctx, "commit", ref, func(context.Context) (*payload.Value, error) {
			return payload.NewTensor(cachekey.Uint8, []int64{int64(size)}, data), nil
		}); err != nil {
			b.Fatal(err)
		}
		a.cache.Release("commit")
		e, err := kv.Get(ctx, ref.KVKey())
		if err != nil {
			b.Fatal(err)
		}
		rec, err := lease.DecodeRecord(ref.KVKey(), e.Value())
		if err != nil || rec.State != lease.StateCommitted || rec.Location.Address != a.payload {
			b.Fatalf("record %+v %v", rec, err)
		}
		b.StartTimer()

		t0 := time.Now()
		v, err := plain.Get(ctx, *rec.Location)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		v.Close()
		t2 := time.Now()
		resp, err := bn.client.Lookup(ctx, agent.KeyRef{Key: key.String(), Tenant: "acme", Model: "m"}, "bench")
		if err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		tPlain += t1.Sub(t0)
		tAgent += t3.Sub(t2)

		b.StopTimer()
		if resp.Status != agent.StatusHit || resp.Path != coordinator.PathRemoteHit.String() || resp.Value.Length != int64(size) {
			b.Fatalf("lookup on b: %+v", resp)
		}
		bn.client.Release(ctx, "bench")
		// Keep tmpfs small: drop a's copy, and b's previous one, which
		// left b's cache when this one landed (b's agent, like any, keeps
		// its files; deleting the mapped one now would free its memory in
		// the next lookup, a cost production does not pay there).
		os.Remove(a.store.Path(ref.Object()))
		if prev != nil {
			os.Remove(bn.store.Path(prev.Object()))
		}
		prev = &ref
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(tPlain.Seconds()*1e3/n, "ms-plain-get")
	b.ReportMetric(tAgent.Seconds()*1e3/n, "ms-agent-hit")
	b.ReportMetric(float64(tAgent)/float64(tPlain), "x-plain-get")
}
