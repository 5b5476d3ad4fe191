package demo

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/node"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startWorker runs a worker of role over HTTP on a node of its own until
// the test ends, and returns its base URL.
func startWorker(t *testing.T, url, shmDir, role string) (string, *Worker) {
	t.Helper()
	n, err := node.New(node.Options{NATSURL: url, Name: "demo", ShmDir: shmDir, Strict: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	w, err := NewWorker(role, n.Name(), n.Cache(), 64<<10, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- w.ServeHTTP(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	return "http://" + l.Addr().String(), w
}

// TestLoadThroughWorkers is the compose workload in one process: every
// unique input is encoded once, by the encoder, and every request answered.
func TestLoadThroughWorkers(t *testing.T) {
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	shmDir := filepath.Join(t.TempDir(), "shm")
	enc, ew := startWorker(t, srv.ClientURL(), shmDir, "encoder")
	pre, _ := startWorker(t, srv.ClientURL(), shmDir, "prefill")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := Load(ctx, LoadConfig{Encoder: enc, Prefills: []string{pre}, Requests: 30, Unique: 6, Zipf: 1.1, Concurrency: 4, Seed: 1}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range r.Paths {
		total += n
	}
	if !r.ForwardsExact || !r.ForwardsOK || r.Retries != 0 || total != 60 || r.Paths["computed"] != 6 {
		t.Fatalf("report %+v", r)
	}
	if s := ew.Stats(); s.Forwards != 6 || s.Role != "encoder" || s.Requests != 30 {
		t.Fatalf("encoder stats %+v", s)
	}
	// A second run against the same workers reports its own forwards (none:
	// every input is cached), not the workers' lifetime totals, and passes.
	again, err := Load(ctx, LoadConfig{Encoder: enc, Prefills: []string{pre}, Requests: 30, Unique: 6, Zipf: 1.1, Concurrency: 4, Seed: 1}, io.Discard)
	if err != nil || again.EncoderForwards != 0 || !again.WarmStart || !again.ForwardsOK || again.Paths["computed"] != 0 {
		t.Fatalf("a second run: %+v %v", again, err)
	}
	if r.WarmStart {
		t.Fatalf("the first run started warm: %+v", r)
	}
	if res := ew.Handle(ctx, Request{ID: 99, Image: 1}); res.Path != "no-cache" || !res.Forward || res.Err != "" {
		t.Fatalf("without the cache: %+v", res)
	}
}
