package coordinator

// Review tests (branch review): attacks on b6e78c2 (generation deletes),
// 6c8ab85 (the payload sweep), a2b2ad9 (Acquire gives back a create that
// lands for a caller gone) and 2a8c794/5bae253/9a8c335 (Close). Each says
// what it shows; real embedded NATS, real shm stores, real processes.

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
)

// holdFileLock starts a process (flock(1)) holding an exclusive flock on
// path, as any local process that can open the file can (the store's
// user's, a member of its --shm-group), or a process of the node stopped inside an shm Delete or Put
// of the key. It is ended, by its id, by the returned func (and at the
// test's end).
func holdFileLock(t *testing.T, path string) (release func()) {
	t.Helper()
	cmd := exec.Command("flock", "-o", "-x", path, "sleep", "120")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("flock(1): %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	release = func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	t.Cleanup(release)
	waitFor(t, func() bool {
		f, err := os.Open(path)
		if err != nil {
			return false
		}
		defer f.Close()
		return errors.Is(syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB), syscall.EWOULDBLOCK)
	})
	return release
}

// TestCloseWaitsForACommitStuckOnAFileLock: b6e78c2 makes an shm Put
// that finds the key's file there take the file's flock, blocking and
// deaf to ctx. A compute of this process commits the same bytes as a file
// already in the node's store (the key computed before, its record gone)
// while another process of the node holds that file's lock: the commit's
// Put waits, its lease is renewed all the while (the key stays "computing"
// for the cluster), and Close, which cancels the request and waits for it
// ("a request that is not computing ... each ended by its ctx or its op
// timeout ... is always waited for"), does not return while the lock is
// held: here not within 15 s (lease TTL 1 s, op timeout 2 s).
func TestCloseWaitsForACommitStuckOnAFileLock(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	store, err := shm.Open(filepath.Join(t.TempDir(), "shm"), shm.WithNode("test-node"))
	if err != nil {
		t.Fatal(err)
	}
	// The key's file from an earlier compute, whose record is gone.
	if _, err := store.Put(ctx, ref(1).Object(), embedding(1)); err != nil {
		t.Fatal(err)
	}
	release := holdFileLock(t, store.Path(ref(1).Object()))
	c := newCache(t, url, store, shmRoute(t, store), WithPayloadSweep(-1))
	var cnt counter
	got := make(chan result, 1)
	go func() {
		v, path, err := c.GetOrComputePath(ctx, "r", ref(1), cnt.fn(1))
		got <- result{v, path, err}
	}()
	waitFor(t, func() bool { return cnt.n[1].Load() == 1 })
	time.Sleep(500 * time.Millisecond) // the commit's Put is waiting for the lock
	closed := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		c.Close()
		closed <- time.Since(start)
	}()
	select {
	case d := <-closed:
		t.Logf("Close returned after %v", d)
	case <-time.After(15 * time.Second):
		e := recordOf(t, url, ref(1))
		t.Errorf("Close has not returned in 15s: it waits for a commit whose shm Put waits for another process's flock "+
			"(the key's record meanwhile: live %v, %v, rev %d)", e.Live, e.Record.State, e.Rev)
		release()
		<-closed
	}
	r := within(t, got)
	if r.err == nil {
		c.Release("r")
	}
}

// TestCloseWithTheServerGoneMidInvalidate: 9a8c335 lets an
// Invalidate in flight finish (its tombstone, then its event, "each within
// the op timeout") and Close waits for it. The NATS server stops right
// after the tombstone is written, and Close begins then: the publish fails
// within its op timeout, Invalidate says the event was not published, and
// Close returns within a bound of a few op timeouts, leaving no goroutine
// of the Cache (the package's goleak check).
func TestCloseWithTheServerGoneMidInvalidate(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t)
	var c *Cache
	closed := make(chan time.Duration, 1)
	hook := func(s *settings) error {
		s.tombstoneWritten = func(closing context.Context) {
			srv.Shutdown()
			start := time.Now()
			go func() {
				c.Close()
				closed <- time.Since(start)
			}()
			<-closing.Done()
		}
		return nil
	}
	const op = 500 * time.Millisecond
	c = newCache(t, srv.ClientURL(), payload.NewMemoryStore("test-node", 0), WithEvents(0), WithOpTimeout(op), hook)
	waitFor(t, func() bool { return c.eventLink() != nil })
	start := time.Now()
	err := c.Invalidate(ctx, "acme", "m", 1)
	took := time.Since(start)
	if err == nil || !contains(err.Error(), "tombstone is written") {
		t.Errorf("Invalidate with the server gone after its tombstone: %v, want the event-not-published error", err)
	}
	select {
	case d := <-closed:
		t.Logf("Invalidate returned after %v (%v), Close after %v", took, err, d)
		if d > 10*op+5*time.Second {
			t.Errorf("Close took %v with an Invalidate in flight and the server gone (op timeout %v)", d, op)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Close did not return in 60s with the server gone")
	}
}

// TestAWorkersSweepLeavesTheAgentsPulledCopy: 6c8ab85 keeps a
// node's file of another node's live value only in a process whose router
// pulls into the node's store (WithPullToNodeStore), and decides that per
// sweeping process. But the store is the node's, shared by its processes
// (docs/operations.md runs `embcache agent` and `embcache worker` on one
// machine with the same --shm-dir and, by default, the same --node, the
// hostname; `embcache agent` pulls into the store, a worker does not).
// The agent's copy of node B's live value, the file its clients map, is
// removed by the worker's sweep (before 6c8ab85, a live record of its
// bytes kept it): docs/protocol.md 4.4 says a process that pulls values
// into its store "keeps it as its copy of that value".
func TestAWorkersSweepLeavesTheAgentsPulledCopy(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	a, b := newShmNode(t, "node-a"), newShmNode(t, "node-b")
	var cnt counter
	if _, err := b.cache(t, url).GetOrCompute(ctx, "r", ref(1), cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	agent := a.cache(t, url, payload.WithPullToNodeStore()) // node A's agent
	worker := a.cache(t, url)                               // a worker of node A, same store and node name
	if _, path, err := agent.GetOrComputePath(ctx, "r", ref(1), noCompute(t)); err != nil || path != PathRemoteHit {
		t.Fatalf("the agent's read of B's value: %v %v", path, err)
	}
	agent.Release("r")
	obj := ref(1).Object()
	if _, err := os.Stat(a.store.Path(obj)); err != nil {
		t.Fatalf("the agent's pulled copy: %v", err)
	}
	if n := agent.sweepPayloads(ctx, 0); n != 0 {
		t.Fatalf("the agent's own sweep removed %d files", n)
	}
	worker.sweepPayloads(ctx, 0)
	if e := recordOf(t, url, ref(1)); !e.Live || e.Record.Location == nil || e.Record.Location.Node != "node-b" {
		t.Fatalf("B's record: %+v", e)
	}
	if _, err := os.Stat(a.store.Path(obj)); err != nil {
		t.Errorf("node A's worker swept the agent's copy of B's live value (the file the agent's clients map): %v", err)
	}
}
