package integration

import (
	"syscall"
	"testing"
	"time"
)

// TestMultiProcessExactlyOnce: 8 processes x 8 goroutines request the same
// 50 keys together; each key's fn runs exactly once across all of them
// (counted in a shared log), and every process gets bit-identical bytes.
func TestMultiProcessExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 8 processes")
	}
	const procs, keys = 8, 50
	e := newEnv(t, 5*time.Second)
	workers := make([]*proc, procs)
	for i := range workers {
		workers[i] = e.start(modeBurst, env2("EMBCACHE_KEYS", "50"), env2("EMBCACHE_GOROUTINES", "8"))
	}
	for _, w := range workers {
		if r := w.next(); r.Path != "ready" {
			t.Fatalf("worker not ready: %+v", r)
		}
	}
	for _, w := range workers {
		w.send("go")
	}
	want := map[int]string{}
	for k := range keys {
		want[k] = sum(encode(k, false))
	}
	var remote, computed uint64
	for i, w := range workers {
		for range keys {
			r := w.next()
			if r.Sum != want[r.Key] {
				t.Fatalf("worker %d key %d: sum %s, want %s", i, r.Key, r.Sum, want[r.Key])
			}
		}
		st := w.next()
		remote += st.Stats.RemoteHits
		computed += st.Stats.Computes
		w.wait()
	}
	counts := e.computeCounts()
	for k := range keys {
		if counts[k] != 1 {
			t.Errorf("key %d computed %d times across %d processes", k, counts[k], procs)
		}
	}
	t.Logf("%d processes x 8 goroutines x %d keys: %d computes, %d remote pulls", procs, keys, computed, remote)
}

// TestHolderKilledTakeover: the process computing a key is SIGKILLed; a
// waiter in another process takes over once the lease expires, and
// computes the key; the dead holder never committed.
func TestHolderKilledTakeover(t *testing.T) {
	const leaseTTL = time.Second
	e := newEnv(t, leaseTTL)
	holder := e.start(modeHold)
	if r := holder.next(); r.Path != "computing" {
		t.Fatalf("holder: %+v", r)
	}
	waiter := e.start(modeGet)
	killed := time.Now()
	holder.cmd.Process.Signal(syscall.SIGKILL)
	r := waiter.next()
	took := time.Since(killed)
	if r.Err != "" || r.Path != "computed" || r.Sum != sum(encode(0, false)) {
		t.Fatalf("waiter: %+v", r)
	}
	// The server expires a lease late, never early; allow it a few seconds.
	if took > leaseTTL+5*time.Second {
		t.Fatalf("takeover took %v with a %v lease", took, leaseTTL)
	}
	waiter.wait()
	if c := e.computeCounts(); c[0] != 2 {
		t.Fatalf("computes of key 0: %d, want 2 (the killed holder and the taker)", c[0])
	}
	reader := e.start(modeGet)
	if r := reader.next(); r.Path != "remote-hit" || r.Sum != sum(encode(0, false)) {
		t.Fatalf("reader after takeover: %+v", r)
	}
	t.Logf("takeover %v after SIGKILL (lease TTL %v)", took.Round(time.Millisecond), leaseTTL)
}

// TestZombieHolderRefused: the holder is paused (SIGSTOP) past its lease;
// another process takes over and commits; the holder resumes, finishes
// with different bytes, and its commit is refused by the revision check.
// The cluster serves the new holder's value.
func TestZombieHolderRefused(t *testing.T) {
	e := newEnv(t, time.Second)
	zombie := e.start(modeHold)
	if r := zombie.next(); r.Path != "computing" {
		t.Fatalf("holder: %+v", r)
	}
	zombie.cmd.Process.Signal(syscall.SIGSTOP)
	taker := e.start(modeGet)
	if r := taker.next(); r.Err != "" || r.Path != "computed" {
		t.Fatalf("taker: %+v", r)
	}
	taker.wait()
	zombie.cmd.Process.Signal(syscall.SIGCONT)
	zombie.send("finish")
	r := zombie.next()
	if r.Err != "" || r.Sum != sum(encode(0, true)) || r.Stats.CommitsRefused+r.Stats.LeasesLost == 0 {
		t.Fatalf("zombie: %+v (its commit must be refused)", r)
	}
	zombie.wait()
	reader := e.start(modeGet)
	if r := reader.next(); r.Path != "remote-hit" || r.Sum != sum(encode(0, false)) {
		t.Fatalf("the cluster serves %+v, want the taker's value", r)
	}
}
