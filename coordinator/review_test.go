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

	"github.com/embcache/embcache/payload/shm"
)

// holdFileLock starts a process (flock(1)) holding an exclusive flock on
// path, as any local process that can open the file can (0444 in a 0755
// directory), or a process of the node stopped inside an shm Delete or Put
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

// TestReviewCloseWaitsForACommitStuckOnAFileLock: b6e78c2 makes an shm Put
// that finds the key's file there take the file's flock, blocking and
// deaf to ctx. A compute of this process commits the same bytes as a file
// already in the node's store (the key computed before, its record gone)
// while another process of the node holds that file's lock: the commit's
// Put waits, its lease is renewed all the while (the key stays "computing"
// for the cluster), and Close, which cancels the request and waits for it
// ("a request that is not computing ... each ended by its ctx or its op
// timeout ... is always waited for"), does not return while the lock is
// held: here not within 15 s (lease TTL 1 s, op timeout 2 s).
func TestReviewCloseWaitsForACommitStuckOnAFileLock(t *testing.T) {
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
