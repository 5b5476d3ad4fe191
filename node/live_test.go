package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/live"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// runAggregator runs an Aggregator on url until the test ends.
func runAggregator(t *testing.T, url string, opts ...nats.Option) *live.Aggregator {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := live.NewAggregator(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		nc.Close()
	})
	return a
}

// TestNodesPublishTheirSummaries: a node with a Cache and one that only
// reconciles announce themselves; the view's counts are the Cache's own.
func TestNodesPublishTheirSummaries(t *testing.T) {
	srv := startServer(t)
	a := runAggregator(t, srv.ClientURL())
	rec := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "serve-1", ShmDir: t.TempDir(), LeaseTTL: time.Second,
		NoCache: true, Reconciler: true, Role: live.RoleServe, SummaryInterval: 200 * time.Millisecond, Logger: quiet})
	w := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "gpu-1", ShmDir: t.TempDir(), Role: live.RoleWorker,
		SummaryInterval: 200 * time.Millisecond, Version: "v-test", Logger: quiet})
	ctx := context.Background()
	for i := range 3 {
		for range 2 {
			if _, err := w.Cache().GetOrCompute(ctx, "r", ref(t, string(rune('a'+i))), encode); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := w.Cache().Stats()
	var v live.View
	waitFor(t, "both heard, with the Cache's counts and the reconciler active", func() bool {
		v = a.View()
		// By node: gpu-1, then serve-1.
		return len(v.Processes) == 2 && v.Totals.Counters.Total == 6 && v.Processes[1].Reconciler != nil &&
			v.Processes[1].Reconciler.Active
	})
	p := v.Processes[0]
	if p.Node != "gpu-1" || p.Role != live.RoleWorker || p.Version != "v-test" || v.Processes[1].Role != live.RoleServe {
		t.Fatalf("processes %+v", v.Processes)
	}
	if p.Counters.Requests["computed"] != want.Requests["computed"] || p.Counters.Requests["local-hit"] != 3 ||
		p.Counters.Forwards != want.Computes || p.Counters.Written["shm"] != want.WrittenBytes["shm"] {
		t.Fatalf("gpu-1 %+v, its Stats %+v", p.Counters, want)
	}
	if rec.Summaries() == nil || w.Summaries().Stats().Failed != 0 {
		t.Fatal("publisher")
	}
}

// TestANodeThatMayNotPublishSummariesServes: its NATS user may not
// publish on embcache.sum.>; the server refuses each summary, and the
// node's requests are served all the same.
func TestANodeThatMayNotPublishSummariesServes(t *testing.T) {
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Configure: func(o *server.Options) error {
		o.Users = []*server.User{
			{Username: "worker", Password: "w", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"embcache.sum.>"}}}},
			{Username: "ops", Password: "o"},
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	a := runAggregator(t, srv.ClientURL(), nats.UserInfo("ops", "o"))
	refused := make(chan struct{}, 1)
	w := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "gpu-1", ShmDir: t.TempDir(), Role: live.RoleWorker,
		SummaryInterval: 100 * time.Millisecond, Logger: quiet, NATSOptions: []nats.Option{nats.UserInfo("worker", "w"),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case refused <- struct{}{}:
				default:
				}
			})}})
	select {
	case <-refused:
	case <-time.After(10 * time.Second):
		t.Fatal("the server never refused a summary")
	}
	ctx := context.Background()
	for i := range 3 {
		_, path, err := w.Cache().GetOrComputePath(ctx, "r", ref(t, string(rune('a'+i))), encode)
		if err != nil || path != coordinator.PathComputed {
			t.Fatalf("request %d: %v %v", i, path, err)
		}
	}
	if w.Cache().Stats().Requests["computed"] != 3 {
		t.Fatal("not counted")
	}
	if n := a.View().Totals.Processes; n != 0 {
		t.Fatalf("the view heard %d processes", n)
	}
}

func encode(context.Context) (*payload.Value, error) {
	return payload.NewTensor(cachekey.Float32, []int64{4}, make([]byte, 16)), nil
}
