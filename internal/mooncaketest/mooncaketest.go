// Package mooncaketest starts a real Mooncake Store for tests: a
// mooncake_master on free loopback ports, from the bundle make
// test-mooncake unpacks ($EMBCACHE_MOONCAKE_DIR) or a Mooncake install of
// the user's ($MOONCAKE_DIR).
package mooncaketest

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/embcache/embcache/internal/mooncakemaster"
)

// Dir is the directory of a real Mooncake Store (lib/libmooncake_store.so,
// bin/mooncake_master): $EMBCACHE_MOONCAKE_DIR, or $MOONCAKE_DIR. Without
// either the test skips, saying why, unless EMBCACHE_REQUIRE_MOONCAKE=1
// (.ci/run sets it): then it fails.
func Dir(t testing.TB) string {
	t.Helper()
	for _, env := range mooncakemaster.DirEnv {
		if dir := os.Getenv(env); dir != "" {
			if _, err := os.Stat(Library(dir)); err != nil {
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
func Library(dir string) string { return mooncakemaster.Library(dir) }

// Tail is the last n bytes of s.
func Tail(s string, n int) string { return mooncakemaster.Tail(s, n) }

// Master is a mooncake_master of a test: running from StartMaster until
// the test ends, unless Stop or Kill ends it first; Restart runs it again
// on the same ports.
type Master struct {
	*mooncakemaster.Master

	t    testing.TB
	logs []string // the output of the masters that have exited
}

// StartMaster starts a mooncake_master of dir on free loopback ports
// (flags added), stopped at the test's end, and waits until it answers.
func StartMaster(t testing.TB, dir string, flags ...string) *Master {
	t.Helper()
	mm, err := mooncakemaster.New(dir, flags...)
	if err != nil {
		t.Fatal(err)
	}
	m := &Master{Master: mm, t: t}
	t.Cleanup(func() {
		if m.Running() {
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
	if m.Running() {
		m.t.Fatal("mooncaketest: Restart of a running master")
	}
	if err := m.Start(); err != nil {
		m.t.Fatal(err)
	}
}

// Stop ends the master with SIGTERM (SIGKILL if it has not exited within
// 10 s) and waits for it.
func (m *Master) Stop() { m.t.Helper(); m.end(syscall.SIGTERM) }

// Kill ends the master with SIGKILL and waits for it.
func (m *Master) Kill() { m.t.Helper(); m.end(syscall.SIGKILL) }

func (m *Master) end(sig syscall.Signal) {
	m.t.Helper()
	if !m.Running() {
		m.t.Fatal("mooncaketest: the master is not running")
	}
	m.logs = append(m.logs, m.Master.Stop(sig))
}
