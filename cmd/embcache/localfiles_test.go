package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/embcache/embcache/internal/localdir/localdirtest"
	"golang.org/x/sys/unix"
)

const nobody = localdirtest.Nobody

// TestCommandsRefuseAnotherUsersDirectories: serve, worker and agent exit
// 1 naming the directory another user made first under the name they use
// (--shm-dir, its .slots, --socket's directory), and write nothing there.
func TestCommandsRefuseAnotherUsersDirectories(t *testing.T) {
	base := t.TempDir()
	shm, slots, run2 := filepath.Join(base, "shm"), filepath.Join(base, "shm2.slots"), filepath.Join(base, "run")
	localdirtest.Squat(t, shm, 0o777)
	localdirtest.Squat(t, slots, 0o777)
	localdirtest.Squat(t, run2, 0o777)
	for _, c := range []struct {
		dir  string
		args []string
	}{
		{shm, []string{"worker", "--nats", "nats://127.0.0.1:1", "--shm-dir", shm}},
		{shm, []string{"serve", "--nats", "nats://127.0.0.1:1", "--shm-dir", shm}},
		{shm, []string{"agent", "--nats", "nats://127.0.0.1:1", "--wait-store", "0s", "--shm-dir", shm, "--socket", filepath.Join(base, "a.sock")}},
		{slots, []string{"agent", "--nats", "nats://127.0.0.1:1", "--wait-store", "0s", "--shm-dir", filepath.Join(base, "shm2"), "--socket", filepath.Join(base, "b.sock")}},
		{run2, []string{"agent", "--nats", "nats://127.0.0.1:1", "--wait-store", "0s", "--shm-dir", filepath.Join(base, "shm3"), "--socket", filepath.Join(run2, "agent.sock")}},
	} {
		_, stderr, code := run(t, c.args...)
		if code != 1 || !strings.Contains(stderr, c.dir+": is owned by uid 65534") {
			t.Errorf("%v: exit %d, want 1 naming %s as another user's:\n%s", c.args, code, c.dir, stderr)
		}
		if names, _ := os.ReadDir(c.dir); len(names) != 0 {
			t.Errorf("%v: wrote into %s: %v", c.args, c.dir, names)
		}
	}
}

// TestAgentShmGroup: without --shm-group only the agent's user connects
// (a user of its primary group is refused); with it, a process of another
// user in the group connects and one outside it does not. Each connection
// is a child process of that user's.
func TestAgentShmGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to act as another user")
	}
	for _, c := range []struct {
		group      []string
		socketMode uint32
		in, out    int // a group whose process connects, and one whose does not (-1: none)
	}{
		{nil, 0o600, -1, os.Getegid()},
		{[]string{"--shm-group", "65534"}, 0o660, nobody, 4243},
	} {
		base := localdirtest.Dir(t)
		socket := filepath.Join(base, "run", "agent.sock")
		args := append([]string{"agent", "--nats", "nats://127.0.0.1:1", "--wait-store", "0s", "--node", "a1",
			"--shm-dir", filepath.Join(base, "shm"), "--socket", socket}, c.group...)
		out := startProcess(t, args...)
		waitOutput(t, out, "listening on", "")
		var st unix.Stat_t
		if err := unix.Stat(socket, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&0o777 != c.socketMode || c.group != nil && st.Gid != nobody {
			t.Fatalf("%v: socket mode %04o group %d, want %04o", c.group, st.Mode&0o777, st.Gid, c.socketMode)
		}
		if c.in >= 0 {
			if err := localdirtest.As(t, nobody, c.in, localdirtest.Dial, socket); err != nil {
				t.Fatalf("%v: a process of group %d: %v", c.group, c.in, err)
			}
		}
		if err := localdirtest.As(t, nobody, c.out, localdirtest.Dial, socket); !errors.Is(err, fs.ErrPermission) {
			t.Fatalf("%v: a process of group %d: %v, want permission denied", c.group, c.out, err)
		}
	}
}
