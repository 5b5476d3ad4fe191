package embedded

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartRestartKeepsData(t *testing.T) {
	ctx := context.Background()
	s, err := Start(Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	s2, err := Start(Options{StoreDir: t.TempDir()}) // two servers, one process
	if err != nil {
		t.Fatal(err)
	}
	s2.Shutdown()

	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "T", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	s.Shutdown()
	s.Shutdown() // idempotent
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	nc, err = s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	kv, err = js.KeyValue(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "v" {
		t.Fatalf("after restart: %v", err)
	}
	if err := s.Restart(); err == nil {
		t.Fatal("restart of a running server succeeded")
	}
}

func TestAuth(t *testing.T) {
	s, err := Start(Options{StoreDir: t.TempDir(), Username: "u", Password: "p"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("u", "wrong")); err == nil {
		nc.Close()
		t.Fatal("wrong password accepted")
	}
}

func TestClusterR3SurvivesLeaderLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := StartCluster(ctx, 3, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	nc, err := c.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "T", Replicas: 3, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	// A new R3 stream answers once its group has elected a leader: the
	// create call can return before that ("no response from stream").
	putUntilAccepted(ctx, t, kv, "v1")
	leader, err := c.StreamLeader(ctx, js, "KV_T")
	if err != nil {
		t.Fatal(err)
	}
	leader.Shutdown()
	putUntilAccepted(ctx, t, kv, "v2") // writes resume once a new leader is elected
	if err := leader.Restart(); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "v2" {
		t.Fatalf("after failover: %v", err)
	}
}

// putUntilAccepted writes k=value, retrying while the stream has no leader,
// until ctx ends.
func putUntilAccepted(ctx context.Context, t *testing.T, kv jetstream.KeyValue, value string) {
	t.Helper()
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		_, err := kv.Put(attempt, "k", []byte(value))
		cancelAttempt()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("put %s: no leader accepted it: %v", value, err)
		case <-time.After(50 * time.Millisecond): // a back-off, not an ordering
		}
	}
}

// A node whose port is taken while it is down says so at once, and comes
// back on the same port once it is free.
func TestRestartOnTakenPort(t *testing.T) {
	s, err := Start(Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	s.Shutdown()
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.opts.Port)))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.Restart(); !errors.Is(err, ErrPortInUse) {
		l.Close()
		t.Fatalf("restart on a taken port: %v, want ErrPortInUse", err)
	}
	if d := time.Since(start); d > s.opts.ReadyTimeout/2 {
		t.Errorf("restart on a taken port took %v", d)
	}
	l.Close()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
}

func TestPortWalk(t *testing.T) {
	file := func(content string) string {
		f := filepath.Join(t.TempDir(), "range")
		if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, tc := range []struct {
		content string
		lo, hi  int
	}{
		{"32768\t60999\n", minPort, 32768}, // Linux's default: below the ephemeral range
		{"1024 40000\n", 40001, 65536},     // above it
		{"1024 65000\n", 0, 0},             // no room: the kernel picks
		{"garbage", 0, 0},                  // unknown
	} {
		w := newPortWalk(file(tc.content))
		if w.lo != tc.lo || w.hi != tc.hi {
			t.Errorf("%q: range [%d, %d), want [%d, %d)", tc.content, w.lo, w.hi, tc.lo, tc.hi)
		}
	}
	if w := newPortWalk(filepath.Join(t.TempDir(), "missing")); w.hi != 0 {
		t.Errorf("no range file: range [%d, %d)", w.lo, w.hi)
	}
	if _, ok := newPortWalk("/nonexistent").next("127.0.0.1"); ok {
		t.Error("a walk without a range handed out a port")
	}

	// The walk hands out free ports of its range, none twice in a row, and
	// skips a port that is taken.
	w := newPortWalk(file("32768 60999"))
	p1, ok := w.next("127.0.0.1")
	if !ok || p1 < w.lo || p1 >= w.hi {
		t.Fatalf("port %d (%v), want one in [%d, %d)", p1, ok, w.lo, w.hi)
	}
	w.mu.Lock()
	taken := w.cursor
	w.mu.Unlock()
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(taken)))
	if err != nil {
		t.Skipf("port %d: %v", taken, err)
	}
	defer l.Close()
	p2, ok := w.next("127.0.0.1")
	if !ok || p2 == p1 || p2 == taken {
		t.Errorf("ports %d then %d (%v); %d was taken", p1, p2, ok, taken)
	}
}

// Two clusters in one process have names of their own: a route from one
// to the other is refused, not merged.
func TestClustersHaveTheirOwnNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var names []string
	for range 2 {
		c, err := StartCluster(ctx, 3, t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, c.Nodes[0].opts.ClusterName)
		c.Shutdown()
	}
	if names[0] == names[1] {
		t.Fatalf("two clusters named %q", names[0])
	}
}

// TestOneServerPerStoreDir: a second server on a running one's StoreDir
// started and wrote the same streams' files (a walkthrough's two serve
// commands both said ready, their byte counts drifting apart). It is
// refused; the directory is free again after Shutdown. A StoreDir that
// cannot be made is said so at once (it was "server not ready" after 10 s).
func TestOneServerPerStoreDir(t *testing.T) {
	dir := t.TempDir()
	s, err := Start(Options{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(Options{StoreDir: dir}); !errors.Is(err, ErrStoreDirInUse) {
		t.Fatalf("a second server: %v, want ErrStoreDirInUse", err)
	}
	s.Shutdown()
	if err := s.Restart(); err != nil {
		t.Fatalf("after shutdown: %v", err)
	}
	s.Shutdown()
	if _, err := Start(Options{StoreDir: "/proc/no-store", ReadyTimeout: time.Minute}); err == nil ||
		errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "store directory") {
		t.Fatalf("an impossible StoreDir: %v", err)
	}
}

// A cluster's JetStream is ready once all its nodes are: one node of
// three has no quorum, no meta leader, and WaitJetStream says so when it
// gives up; with its peers up, it is ready.
func TestWaitJetStreamSaysWhatIsNotReady(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	opts := make([]Options, 3)
	var routes []string
	for i := range opts {
		client, err := FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		route, err := FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		name := "n" + strconv.Itoa(i+1)
		opts[i] = Options{StoreDir: filepath.Join(dir, name), Name: name, Port: client, ClusterName: "not-ready", ClusterPort: route}
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(route))
	}
	c := &Cluster{}
	defer c.Shutdown()
	for i := range opts {
		opts[i].Routes = routes
	}
	n1, err := Start(opts[0])
	if err != nil {
		t.Fatal(err)
	}
	c.Nodes = append(c.Nodes, n1)
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	err = c.WaitJetStream(short)
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "no JetStream meta leader among the running nodes [n1]") {
		t.Fatalf("one node of three: %v", err)
	}
	for _, o := range opts[1:] {
		n, err := Start(o)
		if err != nil {
			t.Fatal(err)
		}
		c.Nodes = append(c.Nodes, n)
	}
	if err := c.WaitJetStream(ctx); err != nil {
		t.Fatal(err)
	}
}
