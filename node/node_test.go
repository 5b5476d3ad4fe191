package node_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startServer(t *testing.T) *embedded.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// startNode starts a node and waits until it is ready; it closes when the test ends.
func startNode(t *testing.T, o node.Options) *node.Node {
	t.Helper()
	n, err := node.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := n.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

var cfg = workload.Config("acme")

func ref(t *testing.T, input string) coordinator.Ref {
	t.Helper()
	key, err := cachekey.FromRawBytes(cfg, []byte(input))
	if err != nil {
		t.Fatal(err)
	}
	return coordinator.NewRef(cfg, key)
}

func TestTwoNodesPullOverHTTP(t *testing.T) {
	srv := startServer(t)
	base := node.Options{NATSURL: srv.ClientURL(), PayloadListen: "127.0.0.1:0", LeaseTTL: time.Second}
	a, b := base, base
	a.Name, a.ShmDir = "a", filepath.Join(t.TempDir(), "shm")
	b.Name, b.ShmDir = "b", filepath.Join(t.TempDir(), "shm")
	na, nb := startNode(t, a), startNode(t, b)
	if na.PayloadAddr() == "" || nb.Store() == nil || na.Name() != "a" {
		t.Fatalf("addr %q store %v name %q", na.PayloadAddr(), nb.Store(), na.Name())
	}

	ctx := context.Background()
	r := ref(t, "jpeg bytes")
	data := bytes.Repeat([]byte{1, 2, 3, 4}, 1024)
	v, path, err := na.Cache().GetOrComputePath(ctx, "req-a", r, func(context.Context) (*payload.Value, error) {
		return payload.NewTensor(cachekey.Uint8, []int64{int64(len(data))}, data), nil
	})
	if err != nil || path != coordinator.PathComputed || !bytes.Equal(v.Tensor.Data, data) {
		t.Fatalf("node a: path %v err %v", path, err)
	}
	na.Cache().Release("req-a")

	v, path, err = nb.Cache().GetOrComputePath(ctx, "req-b", r, func(context.Context) (*payload.Value, error) {
		t.Error("node b computed a committed key")
		return nil, errors.New("computed")
	})
	if err != nil || path != coordinator.PathRemoteHit || !bytes.Equal(v.Tensor.Data, data) {
		t.Fatalf("node b: path %v err %v", path, err)
	}
	nb.Cache().Release("req-b")
}

// computeOn computes r's value on n (it must be a miss) and returns it.
func computeOn(t *testing.T, n *node.Node, r coordinator.Ref, data []byte) {
	t.Helper()
	_, path, err := n.Cache().GetOrComputePath(context.Background(), "w", r, func(context.Context) (*payload.Value, error) {
		return payload.NewTensor(cachekey.Uint8, []int64{int64(len(data))}, data), nil
	})
	if err != nil || path != coordinator.PathComputed {
		t.Fatalf("%s: path %v err %v", n.Name(), path, err)
	}
	n.Cache().Release("w")
}

// pullOn gets r's value on n, which must not compute it.
func pullOn(t *testing.T, n *node.Node, r coordinator.Ref, want []byte) {
	t.Helper()
	v, path, err := n.Cache().GetOrComputePath(context.Background(), "r", r, func(context.Context) (*payload.Value, error) {
		t.Errorf("%s computed a committed key", n.Name())
		return nil, errors.New("computed")
	})
	if err != nil || path != coordinator.PathRemoteHit || !bytes.Equal(v.Tensor.Data, want) {
		t.Fatalf("%s: path %v err %v", n.Name(), path, err)
	}
	n.Cache().Release("r")
}

// A node that writes to its shm store still pulls what HTTP nodes wrote.
// What it wrote, another machine cannot read: that one computes it itself
// and leaves the record (it is not corrupt) to the writer's node.
func TestShmNodePullsFromHTTPNodes(t *testing.T) {
	srv := startServer(t)
	h := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "h", ShmDir: t.TempDir(), PayloadListen: "127.0.0.1:0", NoEvents: true})
	s := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "s", ShmDir: t.TempDir(), NoEvents: true})
	one, two := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	computeOn(t, h, ref(t, "written over http"), one)
	pullOn(t, s, ref(t, "written over http"), one)

	computeOn(t, s, ref(t, "written to shm"), two)
	_, path, err := h.Cache().GetOrComputePath(context.Background(), "r", ref(t, "written to shm"), func(context.Context) (*payload.Value, error) {
		return payload.NewTensor(cachekey.Uint8, []int64{4096}, two), nil
	})
	if err != nil || path != coordinator.PathDegraded {
		t.Fatalf("another machine's shm value: path %v err %v, want degraded", path, err)
	}
	h.Cache().Release("r")
	s.Cache().Drop(ref(t, "written to shm"))
	pullOn(t, s, ref(t, "written to shm"), two) // the record is still there
}

// Workers that do not serve pulls advertise the pull server of their
// node's serve, which serves the node's shm store.
func TestWorkersAdvertiseTheNodesPullServer(t *testing.T) {
	srv := startServer(t)
	dir := t.TempDir()
	serving := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "n1", ShmDir: dir, PayloadListen: "127.0.0.1:0", NoCache: true})
	worker := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "n1", ShmDir: dir, NoEvents: true,
		Advertise: "http://" + serving.PayloadAddr()})
	if worker.PayloadAddr() != "" {
		t.Fatalf("the worker serves pulls on %s", worker.PayloadAddr())
	}
	remote := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "n2", ShmDir: t.TempDir(), NoEvents: true})
	data := bytes.Repeat([]byte{7}, 4096)
	computeOn(t, worker, ref(t, "pulled from serve"), data)
	pullOn(t, remote, ref(t, "pulled from serve"), data)
}

func TestShmByDefault(t *testing.T) {
	srv := startServer(t)
	n := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "solo", ShmDir: t.TempDir(), NoEvents: true})
	if n.PayloadAddr() != "" || n.Cache() == nil || n.Conn() == nil {
		t.Fatalf("addr %q", n.PayloadAddr())
	}
	if err := n.Start(context.Background()); !errors.Is(err, node.ErrStarted) {
		t.Fatalf("second Start: %v", err)
	}
}

func TestReadyWaitsForTheStore(t *testing.T) {
	// No server: the node starts (degraded) and Ready gives up when ctx ends.
	n, err := node.New(node.Options{NATSURL: "nats://127.0.0.1:1", Name: "alone", ShmDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Ready(context.Background()); !errors.Is(err, node.ErrNotStarted) {
		t.Fatalf("Ready before Start: %v", err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := n.Ready(ctx); !errors.Is(err, node.ErrNotReady) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ready without a server: %v", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    node.Options
	}{
		{"no URL", node.Options{Name: "n"}},
		{"no name", node.Options{NATSURL: "nats://x"}},
		{"unknown payload", node.Options{NATSURL: "nats://x", Name: "n", Payload: "carrier-pigeon"}},
		{"http without listen or advertise", node.Options{NATSURL: "nats://x", Name: "n", Payload: node.PayloadHTTP}},
		{"advertise with shm", node.Options{NATSURL: "nats://x", Name: "n", Payload: node.PayloadShm, Advertise: "http://h:1"}},
		{"listen with shm", node.Options{NATSURL: "nats://x", Name: "n", Payload: node.PayloadShm, PayloadListen: ":0"}},
		{"negative shm budget", node.Options{NATSURL: "nats://x", Name: "n", ShmMaxBytes: -1}},
		{"reconciler without events", node.Options{NATSURL: "nats://x", Name: "n", Reconciler: true, NoEvents: true}},
		{"negative events max bytes", node.Options{NATSURL: "nats://x", Name: "n", EventsMaxBytes: -1}},
		{"events max bytes under 1 MiB", node.Options{NATSURL: "nats://x", Name: "n", EventsMaxBytes: 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := node.New(tc.o); !errors.Is(err, node.ErrInvalidOption) {
				t.Fatalf("got %v", err)
			}
		})
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// waitFor polls cond (another node's election, not goroutine order) for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

// TestReconcilerWithoutCache is serve's node: no Cache, a reconciler, the
// event stream created for it.
func TestReconcilerWithoutCache(t *testing.T) {
	srv := startServer(t)
	n := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "serve", ShmDir: t.TempDir(), LeaseTTL: time.Second,
		NoCache: true, Reconciler: true, Logger: quiet})
	if n.Cache() != nil || n.Reconciler() == nil {
		t.Fatalf("cache %v reconciler %v", n.Cache(), n.Reconciler())
	}
	js, err := jetstream.New(n.Conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(context.Background(), events.StreamName); err != nil {
		t.Fatalf("event stream: %v", err)
	}
	waitFor(t, "elected", func() bool { return n.Reconciler().Stats().Active })
}

// TestTheEventStreamTakesTheNodesLimit: a node that creates the event
// stream gives it EventsMaxBytes; a node's reconciler (the operator's)
// gives it to an existing one. (It was 1 GiB whatever the cluster: issue
// 33, item 9.)
func TestTheEventStreamTakesTheNodesLimit(t *testing.T) {
	srv := startServer(t)
	o := node.Options{NATSURL: srv.ClientURL(), LeaseTTL: time.Second, NoCache: true, Logger: quiet}
	a, b := o, o
	a.Name, a.ShmDir, a.EventsMaxBytes = "a", t.TempDir(), 3<<20
	b.Name, b.ShmDir, b.EventsMaxBytes, b.Reconciler = "b", t.TempDir(), 5<<20, true
	na := startNode(t, a)
	js, err := jetstream.New(na.Conn())
	if err != nil {
		t.Fatal(err)
	}
	maxBytes := func() int64 {
		s, err := js.Stream(context.Background(), events.StreamName)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.Config.MaxBytes
	}
	if got := maxBytes(); got != 3<<20 {
		t.Fatalf("created with max bytes %d, want %d", got, 3<<20)
	}
	nb := startNode(t, b)
	waitFor(t, "b elected", func() bool { return nb.Reconciler().Stats().Active })
	waitFor(t, "the reconciler's limit", func() bool { return maxBytes() == 5<<20 })
}

// TestCloseStopsTheReconciler: Close returns after the reconciler's Run,
// and the standby takes over.
func TestCloseStopsTheReconciler(t *testing.T) {
	srv := startServer(t)
	o := node.Options{NATSURL: srv.ClientURL(), LeaseTTL: time.Second, NoCache: true, Reconciler: true, Logger: quiet}
	a, b := o, o
	a.Name, a.ShmDir = "a", t.TempDir()
	b.Name, b.ShmDir = "b", t.TempDir()
	na := startNode(t, a)
	waitFor(t, "a elected", func() bool { return na.Reconciler().Stats().Active })
	nb := startNode(t, b)
	if err := na.Close(); err != nil {
		t.Fatal(err)
	}
	if na.Reconciler().Stats().Active {
		t.Fatal("a's reconciler still active after Close")
	}
	waitFor(t, "b elected", func() bool { return nb.Reconciler().Stats().Active })
}

// TestReadyWithoutCache: with NoCache, Ready is JetStream answering, not
// the NATS connection (serve said ready over a server whose JetStream
// answered nothing).
func TestReadyWithoutCache(t *testing.T) {
	n, err := node.New(node.Options{NATSURL: "nats://127.0.0.1:1", Name: "alone", ShmDir: t.TempDir(), NoCache: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Ready(context.Background()); !errors.Is(err, node.ErrNotStarted) {
		t.Fatalf("Ready before Start: %v", err)
	}
	if err := n.Start(context.Background()); err != nil { // it does not wait for JetStream
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := n.Ready(ctx); !errors.Is(err, node.ErrNotReady) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ready without a server: %v", err)
	}

	noJS, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(),
		Configure: func(o *server.Options) error { o.JetStream = false; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer noJS.Shutdown()
	c, err := node.New(node.Options{NATSURL: noJS.ClientURL(), Name: "connected", ShmDir: t.TempDir(), NoCache: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.Conn().IsConnected() {
		t.Fatal("not connected")
	}
	ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := c.Ready(ctx); !errors.Is(err, node.ErrNotReady) || !strings.Contains(err.Error(), "JetStream: ") {
		t.Fatalf("Ready without JetStream: %v", err)
	}

	srv := startServer(t)
	m := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "up", ShmDir: t.TempDir(), NoCache: true, NoEvents: true})
	if m.Cache() != nil || m.Reconciler() != nil || !m.Conn().IsConnected() {
		t.Fatalf("cache %v reconciler %v", m.Cache(), m.Reconciler())
	}
	if err := m.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// messages is a slog handler that hands each record's message on (and
// drops it when nobody reads).
type messages chan string

func (m messages) Enabled(context.Context, slog.Level) bool { return true }
func (m messages) Handle(_ context.Context, r slog.Record) error {
	select {
	case m <- r.Message:
	default:
	}
	return nil
}
func (m messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m messages) WithGroup(string) slog.Handler      { return m }

// wait returns once a message containing sub came.
func (m messages) wait(t *testing.T, sub string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case msg := <-m:
			if strings.Contains(msg, sub) {
				return
			}
		case <-deadline:
			t.Fatalf("no log message with %q", sub)
		}
	}
}

// A running node logs when its NATS connection is lost and when it is
// back: an operator sees an outage of a running agent or worker, not only
// one at its start (a new user's walkthrough found agent.log silent
// through three outages).
func TestTheConnectionsLossAndReturnAreLogged(t *testing.T) {
	srv := startServer(t)
	logs := make(messages, 64)
	startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "n1", ShmDir: t.TempDir(), NoCache: true, Logger: slog.New(logs)})
	srv.Shutdown()
	logs.wait(t, "NATS connection lost")
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	logs.wait(t, "NATS connection back")
}

// A payload server on every address (":0", as docs/agent.md's ":7070")
// is advertised at this host's name: "http://[::]:7070" (what it was)
// names the puller's own machine (a new user's walkthrough found it).
func TestAWildcardPayloadListenerIsAdvertisedAtTheHostsName(t *testing.T) {
	srv := startServer(t)
	n := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "a", ShmDir: filepath.Join(t.TempDir(), "shm"), PayloadListen: ":0"})
	r := ref(t, "advertised")
	computeOn(t, n, r, []byte{1, 2, 3, 4})
	ctx := context.Background()
	b, err := lease.BindBucket(ctx, n.Conn(), lease.BucketConfig{Name: lease.DefaultBucket})
	if err != nil {
		t.Fatal(err)
	}
	cur, err := b.Read(ctx, r.KVKey())
	if err != nil || !cur.Live || cur.Record.Location == nil {
		t.Fatalf("record: %+v %v", cur, err)
	}
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(n.PayloadAddr())
	if want := "http://" + net.JoinHostPort(host, port); cur.Record.Location.Address != want {
		t.Fatalf("advertised %q, want %q", cur.Record.Location.Address, want)
	} else if n.PayloadAdvertise() != want { // what the commands print at start
		t.Fatalf("PayloadAdvertise %q, want %q", n.PayloadAdvertise(), want)
	}
}
