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

// Master is a running mooncake_master.
type Master struct {
	Addr     string // host:port of its RPC
	Metadata string // its HTTP metadata server's URL
}

// StartMaster starts a mooncake_master of dir on free loopback ports
// (flags added), stopped at the test's end, and waits until it answers.
func StartMaster(t testing.TB, dir string, flags ...string) *Master {
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
			t.Logf("mooncake_master's log:\n%s", Tail(log.String(), 3000))
		}
	})
	m := &Master{Addr: fmt.Sprintf("127.0.0.1:%d", rpc), Metadata: fmt.Sprintf("http://127.0.0.1:%d/metadata", meta)}
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range []string{m.Addr, fmt.Sprintf("127.0.0.1:%d", meta)} {
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
	return m
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
