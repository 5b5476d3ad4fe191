//go:build mooncake && cgo

package mooncake

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/payload"
)

// The tests against a real Mooncake Store: a mooncake_master on free
// loopback ports, and a process that holds the segment the values live in
// (the test binary again, as Mooncake's docs have a long-lived process do),
// while the test's own Store contributes none, as a short-lived writer or
// reader would.

// realMooncake is the directory of a real Mooncake Store (lib/
// libmooncake_store.so, bin/mooncake_master): $EMBCACHE_MOONCAKE_DIR, which
// make test-mooncake sets to the bundle it unpacked, or $MOONCAKE_DIR, a
// Mooncake install of the user's. Without either the test skips, saying
// why, unless EMBCACHE_REQUIRE_MOONCAKE=1 (.ci/run sets it).
func realMooncake(t *testing.T) string {
	t.Helper()
	for _, env := range []string{"EMBCACHE_MOONCAKE_DIR", "MOONCAKE_DIR"} {
		if dir := os.Getenv(env); dir != "" {
			if _, err := os.Stat(filepath.Join(dir, "lib", "libmooncake_store.so")); err != nil {
				t.Fatalf("$%s=%s: %v", env, dir, err)
			}
			return dir
		}
	}
	if os.Getenv("EMBCACHE_REQUIRE_MOONCAKE") == "1" {
		t.Fatal("no real Mooncake Store: set EMBCACHE_MOONCAKE_DIR or MOONCAKE_DIR (make test-mooncake unpacks ../shared/mooncake's bundle)")
	}
	t.Skip("no real Mooncake Store here: make test-mooncake unpacks ../shared/mooncake's bundle, or set MOONCAKE_DIR")
	return ""
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// mooncakeCluster is a running master and its addresses.
type mooncakeCluster struct {
	dir      string
	master   string // host:port of its RPC
	metadata string // its HTTP metadata server's URL
}

// startMaster starts a mooncake_master on free loopback ports, stopped at
// the test's end, and waits until it answers.
func startMaster(t *testing.T, dir string, flags ...string) *mooncakeCluster {
	t.Helper()
	rpc, meta, metrics := freePort(t), freePort(t), freePort(t)
	var log bytes.Buffer
	cmd := exec.Command(filepath.Join(dir, "bin", "mooncake_master"), append([]string{
		"--enable_http_metadata_server=true", "--http_metadata_server_port=" + strconv.Itoa(meta),
		"--rpc_port=" + strconv.Itoa(rpc), "--metrics_port=" + strconv.Itoa(metrics)}, flags...)...)
	cmd.Env = append(os.Environ(), "GLOG_logtostderr=1")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("mooncake_master's log:\n%s", tail(log.String(), 3000))
		}
	})
	c := &mooncakeCluster{dir: dir, master: fmt.Sprintf("127.0.0.1:%d", rpc),
		metadata: fmt.Sprintf("http://127.0.0.1:%d/metadata", meta)}
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range []string{c.master, fmt.Sprintf("127.0.0.1:%d", meta)} {
		for {
			conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("mooncake_master not answering on %s: %v", addr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// config is a Store's config for c: segment is the memory it contributes.
func (c *mooncakeCluster) config(node string, segment uint64) Config {
	return Config{Library: filepath.Join(c.dir, "lib", "libmooncake_store.so"), Node: node,
		LocalHostname: "127.0.0.1", MetadataServer: c.metadata, Protocol: "tcp", MasterServerAddr: c.master,
		GlobalSegmentSize: segment, LocalBufferSize: 64 << 20}
}

// startHolder runs a process that holds a segment of segment bytes in c,
// until the test ends (its stdin closes).
func startHolder(t *testing.T, c *mooncakeCluster, segment uint64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMooncakeSegmentHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), "EMBCACHE_MOONCAKE_HOLDER=1", "HOLDER_LIB="+c.config("", 0).Library,
		"HOLDER_MASTER="+c.master, "HOLDER_METADATA="+c.metadata, "HOLDER_SEGMENT="+strconv.FormatUint(segment, 10))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	ready := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if strings.HasPrefix(s.Text(), "holder:") {
				ready <- s.Text()
				return
			}
		}
		ready <- "exited"
	}()
	select {
	case line := <-ready:
		if line != "holder: ready" {
			t.Fatalf("segment holder: %s\n%s", line, tail(stderr.String(), 3000))
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("segment holder not ready in 30 s\n%s", tail(stderr.String(), 3000))
	}
}

// TestMooncakeSegmentHolder is the segment holder startHolder runs; it
// skips as a test of its own.
func TestMooncakeSegmentHolder(t *testing.T) {
	if os.Getenv("EMBCACHE_MOONCAKE_HOLDER") != "1" {
		t.Skip("the segment holder of the real-Mooncake tests: they run it")
	}
	segment, _ := strconv.ParseUint(os.Getenv("HOLDER_SEGMENT"), 10, 64)
	s, err := Open(Config{Library: os.Getenv("HOLDER_LIB"), Node: "holder", LocalHostname: "127.0.0.1",
		MetadataServer: os.Getenv("HOLDER_METADATA"), Protocol: "tcp", MasterServerAddr: os.Getenv("HOLDER_MASTER"),
		GlobalSegmentSize: segment, LocalBufferSize: 16 << 20})
	if err != nil {
		fmt.Println("holder: open:", err)
		return
	}
	fmt.Println("holder: ready")
	bufio.NewReader(os.Stdin).ReadString(0) // until the parent closes stdin
	s.Close()
}

// A value put by a Store that contributes no memory lands in the holder's
// segment, and is read back bit for bit (8 MiB and 1 byte); a second put
// of the same object is a no-op; a missing object is ErrNotFound.
func TestRealMooncakeRoundTrip(t *testing.T) {
	dir := realMooncake(t)
	c := startMaster(t, dir)
	startHolder(t, c, 256<<20)
	s, err := Open(c.config("n1", 0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, n := range []int{8 << 20, 1} {
		v := value(n)
		loc, err := s.Put(ctx, obj, v)
		if err != nil {
			t.Fatalf("put of %d bytes: %v", n, err)
		}
		got, err := s.Get(ctx, loc)
		if err != nil {
			t.Fatalf("get of %d bytes: %v", n, err)
		}
		if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
			t.Fatalf("%d bytes: the value read back differs", n)
		}
		got.Close()
		if again, err := s.Put(ctx, obj, v); err != nil || again != loc {
			t.Fatalf("second put: %+v %v", again, err)
		}
		obj.Key[0]++
	}
	missing := obj
	missing.Key[1] = 0xee
	loc, err := s.Put(ctx, missing, value(10))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.remove(loc, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrNotFound) {
		t.Fatalf("a removed object: %v, want ErrNotFound", err)
	}
}

// Delete never removes an object under a reader: Mooncake leases an
// object to each reader (here for 1 s, --default_kv_lease_ttl), and
// refuses an unforced remove meanwhile. Delete's own check of the bytes
// is such a read: the first Delete is ErrBusy, and one after the lease
// lapsed removes the object without reading it again; while a reader keeps
// reading, Delete stays ErrBusy and the object stays. A Put of other bytes
// (the key's value after an invalidation) replaces an object a reader just
// got. The waits are the server's lease, in real time.
func TestRealMooncakeDeletesWaitForReaders(t *testing.T) {
	const lease = time.Second
	dir := realMooncake(t)
	c := startMaster(t, dir, "--default_kv_lease_ttl=1000")
	startHolder(t, c, 64<<20)
	s, err := Open(c.config("n1", 0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	o := obj
	o.Key[2] = 0x42
	v := value(1 << 20)
	present := func(loc payload.Location) bool {
		t.Helper()
		ok, err := s.exists(loc)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	read := func(loc payload.Location) {
		t.Helper()
		got, err := s.Get(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		got.Close()
	}

	loc, err := s.Put(ctx, o, v)
	if err != nil {
		t.Fatal(err)
	}
	read(loc) // a reader
	if err := s.Delete(ctx, loc, payload.Generation{}); !errors.Is(err, ErrBusy) || !present(loc) {
		t.Fatalf("a delete while a reader holds the object: %v, present %v; want ErrBusy and the object kept", err, present(loc))
	}
	time.Sleep(lease + 500*time.Millisecond) // every lease lapsed, the delete's own check's too
	if err := s.Delete(ctx, loc, payload.Generation{}); err != nil || present(loc) {
		t.Fatalf("a delete after the leases: %v, present %v; want it removed", err, present(loc))
	}

	// A reader that keeps reading keeps the object.
	if loc, err = s.Put(ctx, o, v); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease + 500*time.Millisecond) // the put's own check's lease
	if err := s.Delete(ctx, loc, payload.Generation{}); !errors.Is(err, ErrBusy) {
		t.Fatalf("the first delete (its own check): %v, want ErrBusy", err)
	}
	time.Sleep(lease / 2)
	read(loc) // the reader again, before the check's lease lapsed
	time.Sleep(lease/2 + 300*time.Millisecond)
	if err := s.Delete(ctx, loc, payload.Generation{}); !errors.Is(err, ErrBusy) || !present(loc) {
		t.Fatalf("a delete while the reader's lease holds: %v, present %v; want ErrBusy and the object kept", err, present(loc))
	}

	// Other bytes replace an object a reader just got.
	read(loc)
	other := value(1 << 20)
	other.Tensor.Data[0]++
	newLoc, err := s.Put(ctx, o, other)
	if err != nil {
		t.Fatalf("a put of other bytes after a get: %v", err)
	}
	got, err := s.Get(ctx, newLoc)
	if err != nil || !bytes.Equal(got.Tensor.Data, other.Tensor.Data) {
		t.Fatalf("the new bytes: %v", err)
	}
	got.Close()
}
