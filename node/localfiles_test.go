package node_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload/shm"
	"golang.org/x/sys/unix"
)

// TestShmDirectoryOfAnotherUserStopsTheNode: a node whose ShmDir another
// user made first (a fixed default name under /dev/shm) does not start,
// and says why (shm.ErrUnsafeDir); it used to write its values there.
func TestShmDirectoryOfAnotherUserStopsTheNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to give a directory to another user")
	}
	dir := filepath.Join(t.TempDir(), "shm")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Options{NATSURL: startServer(t).ClientURL(), Name: "a", ShmDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	err = n.Start(context.Background())
	n.Close()
	if !errors.Is(err, shm.ErrUnsafeDir) {
		t.Fatalf("Start: %v, want shm.ErrUnsafeDir", err)
	}
	if names, _ := os.ReadDir(dir); len(names) != 0 {
		t.Fatalf("the node wrote into it: %v", names)
	}
}

// TestShmGroup: ShmGroup reaches the store (its directory 0750
// set-group-ID of that group); a group that does not exist, or one the
// process is not in, is an invalid option.
func TestShmGroup(t *testing.T) {
	if _, err := node.New(node.Options{NATSURL: "nats://127.0.0.1:1", Name: "a", ShmGroup: "no-such-group-of-embcache"}); !errors.Is(err, node.ErrInvalidOption) {
		t.Fatalf("an unknown group: %v, want ErrInvalidOption", err)
	}
	if os.Geteuid() != 0 {
		if _, err := node.New(node.Options{NATSURL: "nats://127.0.0.1:1", Name: "a", ShmGroup: "4243"}); !errors.Is(err, node.ErrInvalidOption) {
			t.Fatalf("a group the process is not in: %v, want ErrInvalidOption", err)
		}
	}
	gid := os.Getegid()
	if os.Geteuid() == 0 {
		gid = 65534
	}
	dir := filepath.Join(t.TempDir(), "shm")
	n := startNode(t, node.Options{NATSURL: startServer(t).ClientURL(), Name: "a", ShmDir: dir, ShmGroup: strconv.Itoa(gid)})
	if n.Store().Group() != gid {
		t.Fatalf("the store's group: %d, want %d", n.Store().Group(), gid)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o2750 || int(st.Gid) != gid {
		t.Fatalf("%s: mode %04o group %d, want 2750 group %d", dir, st.Mode&0o7777, st.Gid, gid)
	}
}
