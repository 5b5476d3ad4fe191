package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/internal/localdir/localdirtest"
	embnode "github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload/shm"
	"golang.org/x/sys/unix"
)

// The attacks of a local user on the agent's files (issue 39, item 3).
// Before, the agent used the slot and socket directories it found under
// their names, whoever had made them: another user who made
// <shm-dir>.slots first read every input a client keyed and every value
// it committed there, and could rewrite a value before its commit; the
// socket (0660) and the slots (0730 set-group-ID) let the agent's primary
// group in, with nothing configured.

const nobody = localdirtest.Nobody

// otherGroup is a group neither the agent nor nobody is in.
const otherGroup = 4243

// TestUnsafeSlotDirectoryIsRefused: a slot directory another user made
// first (as the squatter would: open to all, or set-group-ID 0730 as
// the agent made it), a link, or one every user may write, is refused by
// New and left as it is.
func TestUnsafeSlotDirectoryIsRefused(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	for _, c := range []struct {
		name string
		make func(dir string)
	}{
		{"another user's, 0777", func(dir string) { localdirtest.Squat(t, dir, 0o777) }},
		{"another user's, 3730", func(dir string) { localdirtest.Squat(t, dir, 0o3730) }},
		{"a link", func(dir string) {
			if err := os.Symlink(t.TempDir(), dir); err != nil {
				t.Fatal(err)
			}
		}},
		{"writable by every user", func(dir string) {
			os.Mkdir(dir, 0)
			unix.Chmod(dir, 0o777)
		}},
		{"writable by the agent's group, none configured", func(dir string) {
			os.Mkdir(dir, 0)
			unix.Chmod(dir, 0o3730)
		}},
	} {
		dir := filepath.Join(t.TempDir(), "slots")
		c.make(dir)
		var before unix.Stat_t
		unix.Lstat(dir, &before)
		srv, err := agent.New(n.cache, n.store, agent.WithSlotDir(dir))
		if err == nil {
			srv.Shutdown(context.Background())
		}
		if !errors.Is(err, shm.ErrUnsafeDir) {
			t.Fatalf("%s: New: %v, want shm.ErrUnsafeDir", c.name, err)
		}
		var after unix.Stat_t
		unix.Lstat(dir, &after)
		if after.Mode != before.Mode || after.Uid != before.Uid {
			t.Fatalf("%s: the refused directory was changed: mode %o uid %d, was %o uid %d", c.name, after.Mode, after.Uid, before.Mode, before.Uid)
		}
	}
}

// TestUnsafeSocketDirectoryIsRefused: ListenUnix refuses a socket
// directory another user owns (who could put a socket of their own in
// the agent's place), a link, and one every user may write.
func TestUnsafeSocketDirectoryIsRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		make func(dir string)
	}{
		{"another user's", func(dir string) { localdirtest.Squat(t, dir, 0o755) }},
		{"a link", func(dir string) {
			if err := os.Symlink(t.TempDir(), dir); err != nil {
				t.Fatal(err)
			}
		}},
		{"writable by every user", func(dir string) {
			os.Mkdir(dir, 0)
			unix.Chmod(dir, 0o777)
		}},
	} {
		dir := filepath.Join(t.TempDir(), "run")
		c.make(dir)
		l, err := agent.ListenUnix(filepath.Join(dir, "agent.sock"))
		if err == nil {
			l.Close()
		}
		if !errors.Is(err, shm.ErrUnsafeDir) {
			t.Fatalf("%s: ListenUnix: %v, want shm.ErrUnsafeDir", c.name, err)
		}
		if _, err := os.Lstat(filepath.Join(dir, "agent.sock")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s: a socket was made there: %v", c.name, err)
		}
	}
}

// listen serves n's agent on a socket ListenUnix makes in dir too, until
// the test ends.
func listen(t *testing.T, n *node, socket string, opts ...agent.ListenOption) {
	t.Helper()
	l, err := agent.ListenUnix(socket, opts...)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		n.srv.Serve(l)
	}()
	t.Cleanup(func() {
		l.Close()
		<-served
	})
}

// hitAndKeySlot commits a value through c and looks it up again: the
// hit's file; and asks for a key slot: its file.
func hitAndKeySlot(t *testing.T, n *node, socket string) (hit, keySlot string) {
	t.Helper()
	c := agent.Dial(socket)
	t.Cleanup(c.Close)
	ctx := context.Background()
	ref := keyOf(t, c, "image-1")
	resp, err := c.Lookup(ctx, ref, "r1")
	if err != nil || resp.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", resp, err)
	}
	if _, err := c.Commit(ctx, resp.Reservation, "r1", "float32", []int64{4}, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { s := n.cache.Stats(); return s.Computes == 1 && s.Local.InFlight == 0 })
	got, err := c.Lookup(ctx, ref, "r2")
	if err != nil || got.Status != agent.StatusHit {
		t.Fatalf("%+v %v", got, err)
	}
	hc := httpClient(t, socket)
	st, _, body := call(t, hc, "/v1/key/slot", "s.1", agent.KeySlotRequest{Size: 1 << 20})
	if st != 200 {
		t.Fatalf("key slot: %d %s", st, body)
	}
	var slot agent.SlotResponse
	if err := json.Unmarshal(body, &slot); err != nil {
		t.Fatal(err)
	}
	return got.Value.File, slot.File
}

// TestOnlyTheAgentsUserGetsIn: without a group, the socket is 0600, the
// slot directory and the store 0700, a key slot 0600: another user, even
// one of the agent's own primary group (gid 0 here), can neither connect,
// nor read a hit's file, nor write a key slot, nor make a slot. Each
// attempt is a child process of that user's.
func TestOnlyTheAgentsUserGetsIn(t *testing.T) {
	base := localdirtest.Dir(t)
	n := startNode(t, startServer(t).ClientURL(), "n1", func(o *embnode.Options) { o.ShmDir = filepath.Join(base, "shm") })
	socket := filepath.Join(base, "run", "agent.sock")
	listen(t, n, socket)
	hit, keySlot := hitAndKeySlot(t, n, socket)
	for path, want := range map[string]uint32{socket: 0o600, filepath.Dir(socket): 0o700, n.slots: 0o700, keySlot: 0o600, hit: 0o400} {
		if mode, _ := localdirtest.ModeOf(t, path); mode != want {
			t.Errorf("%s: mode %04o, want %04o", path, mode, want)
		}
	}
	gid := os.Getegid() // the agent's group
	for _, c := range []struct{ op, path string }{
		{localdirtest.Dial, socket},
		{localdirtest.Read, hit},
		{localdirtest.Write, keySlot},
		{localdirtest.Create, filepath.Join(n.slots, "planted")},
	} {
		if err := localdirtest.As(t, nobody, gid, c.op, c.path); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("%s %s as uid %d of the agent's group %d: %v, want permission denied", c.op, c.path, nobody, gid, err)
		}
	}
}

// TestTheGroupGetsIn: with the store's group (ShmGroup, --shm-group) and
// the socket's (WithSocketGroup), a process of another user in that group
// connects, reads a hit's file, writes its key slot and makes a slot, as
// vLLM's processes of another user do; one of another group does none of
// it.
func TestTheGroupGetsIn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to act as another user")
	}
	base := localdirtest.Dir(t)
	n := startNode(t, startServer(t).ClientURL(), "n1", func(o *embnode.Options) {
		o.ShmDir, o.ShmGroup = filepath.Join(base, "shm"), "65534"
	})
	socket := filepath.Join(base, "run", "agent.sock")
	listen(t, n, socket, agent.WithSocketGroup("65534"))
	hit, keySlot := hitAndKeySlot(t, n, socket)
	for path, want := range map[string]uint32{socket: 0o660, filepath.Dir(socket): 0o2750,
		n.slots: 0o3730, keySlot: 0o660, hit: 0o440} {
		if mode, gid := localdirtest.ModeOf(t, path); mode != want || gid != nobody {
			t.Errorf("%s: mode %04o group %d, want %04o group %d", path, mode, gid, want, nobody)
		}
	}
	for i, c := range []struct{ op, path string }{
		{localdirtest.Dial, socket},
		{localdirtest.Read, hit},
		{localdirtest.Write, keySlot},
		{localdirtest.Create, filepath.Join(n.slots, "a-slot")},
	} {
		if err := localdirtest.As(t, nobody, nobody, c.op, c.path); err != nil {
			t.Errorf("%s %s as uid %d of the group: %v", c.op, c.path, nobody, err)
		}
		if c.op == localdirtest.Create {
			c.path = filepath.Join(n.slots, "another-slot")
		}
		if err := localdirtest.As(t, nobody, otherGroup, c.op, c.path); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("%d: %s %s as uid %d of group %d: %v, want permission denied", i, c.op, c.path, nobody, otherGroup, err)
		}
	}
	// The group cannot list the slots (the names are told only to their
	// connection).
	if err := localdirtest.As(t, nobody, nobody, localdirtest.List, n.slots); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("list the slots as the group: %v, want permission denied", err)
	}
	// A socket directory that exists and that the group cannot search is
	// refused: its clients would not reach the socket.
	closed := filepath.Join(base, "closed")
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	if l, err := agent.ListenUnix(filepath.Join(closed, "agent.sock"), agent.WithSocketGroup("65534")); err == nil {
		l.Close()
		t.Fatal("a socket in a directory its group cannot search")
	}
}

// The socket is made in a private directory and renamed into place (so
// it never lies at its path with the umask's mode): that directory is
// gone once ListenUnix returns, the socket answers at its path with its
// mode, and closing the listener removes it.
func TestTheSocketIsMadeAsideAndMovedIntoPlace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.sock")
	l, err := agent.ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 || entries[0].Name() != "agent.sock" {
		t.Fatalf("the socket's directory holds %v (%v), want the socket alone", entries, err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v, want a socket 0600", fi, err)
	}
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.Close()
	l.Close()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Close: %v, want the socket gone", err)
	}
}
