// Package mooncaketest starts a real Mooncake Store for tests: a
// mooncake_master on free loopback ports, from the bundle make
// test-mooncake unpacks ($EMBCACHE_MOONCAKE_DIR) or a Mooncake install of
// the user's ($MOONCAKE_DIR).
package mooncaketest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Dir is the directory of a real Mooncake Store (lib/libmooncake_store.so,
// bin/mooncake_master): $EMBCACHE_MOONCAKE_DIR, or $MOONCAKE_DIR. Without
// either the test skips, saying why, unless EMBCACHE_REQUIRE_MOONCAKE=1
// (.ci/run sets it): then it fails.
func Dir(t testing.TB) string {
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

// Library is the store's C library in dir.
func Library(dir string) string { return filepath.Join(dir, "lib", "libmooncake_store.so") }

// Master is a mooncake_master of a test: running from StartMaster until
// the test ends, unless Stop or Kill ends it first; Restart runs it again
// on the same ports.
type Master struct {
	Addr     string // host:port of its RPC
	Metadata string // its HTTP metadata server's URL
	Metrics  string // its Prometheus metrics' URL

	t    testing.TB
	bin  string
	args []string
	cmd  *exec.Cmd     // the running master, or nil
	log  *bytes.Buffer // its output; read only once it has exited
	logs []string      // the output of the masters that have exited
}

// StartMaster starts a mooncake_master of dir on free loopback ports
// (flags added), stopped at the test's end, and waits until it answers.
func StartMaster(t testing.TB, dir string, flags ...string) *Master {
	t.Helper()
	rpc, meta, metrics := freePort(t), freePort(t), freePort(t)
	m := &Master{Addr: fmt.Sprintf("127.0.0.1:%d", rpc), Metadata: fmt.Sprintf("http://127.0.0.1:%d/metadata", meta),
		Metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics), t: t, bin: filepath.Join(dir, "bin", "mooncake_master")}
	m.args = append([]string{"--enable_http_metadata_server=true", "--http_metadata_server_port=" + strconv.Itoa(meta),
		"--rpc_port=" + strconv.Itoa(rpc), "--metrics_port=" + strconv.Itoa(metrics)}, flags...)
	t.Cleanup(func() {
		if m.cmd != nil {
			m.end(syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("mooncake_master's log:\n%s", Tail(strings.Join(m.logs, "\n--- restarted ---\n"), 3000))
		}
	})
	m.Restart()
	return m
}

// Restart starts the master again on its ports (after Stop or Kill) and
// waits until it answers. Mooncake's master keeps its objects and its
// segments in memory only: the new one has none until its clients mount
// their segments again.
func (m *Master) Restart() {
	m.t.Helper()
	if m.cmd != nil {
		m.t.Fatal("mooncaketest: Restart of a running master")
	}
	m.log = new(bytes.Buffer)
	m.cmd = exec.Command(m.bin, m.args...)
	m.cmd.Env = append(os.Environ(), "GLOG_logtostderr=1")
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	meta := strings.TrimPrefix(strings.TrimSuffix(m.Metadata, "/metadata"), "http://")
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range []string{m.Addr, meta} {
		for {
			conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				m.t.Fatalf("mooncake_master not answering on %s: %v", addr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Stop ends the master with SIGTERM (SIGKILL if it has not exited within
// 10 s) and waits for it.
func (m *Master) Stop() { m.t.Helper(); m.end(syscall.SIGTERM) }

// Kill ends the master with SIGKILL and waits for it.
func (m *Master) Kill() { m.t.Helper(); m.end(syscall.SIGKILL) }

func (m *Master) end(sig syscall.Signal) {
	m.t.Helper()
	if m.cmd == nil {
		m.t.Fatal("mooncaketest: the master is not running")
	}
	m.cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { m.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		m.cmd.Process.Kill()
		<-done
	}
	m.logs = append(m.logs, m.log.String())
	m.cmd, m.log = nil, nil
}

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
