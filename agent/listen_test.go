package agent_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/embcache/embcache/agent"
)

// TestListenUnixLeavesWhatIsNotASocket: a --socket naming a file of the
// user's was taken for a stale socket and removed.
func TestListenUnixLeavesWhatIsNotASocket(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(file, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if l, err := agent.ListenUnix(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		if l != nil {
			l.Close()
		}
		t.Fatalf("ListenUnix on a regular file: %v", err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me" {
		t.Fatalf("the file after ListenUnix: %q, %v", b, err)
	}

	// A stale socket (its listener gone, the file left) is replaced;
	// one that is served is refused.
	sock := filepath.Join(dir, "a.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	l, err := agent.ListenUnix(sock)
	if err != nil {
		t.Fatalf("ListenUnix on a stale socket: %v", err)
	}
	defer l.Close()
	if _, err := agent.ListenUnix(sock); err == nil || !strings.Contains(err.Error(), "another agent") {
		t.Fatalf("ListenUnix on a served socket: %v", err)
	}
}
