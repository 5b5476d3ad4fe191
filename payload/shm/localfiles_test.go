package shm

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/embcache/embcache/internal/localdir/localdirtest"
	"golang.org/x/sys/unix"
)

// The attacks of a local user on the store's files (issue 39, item 3).
// Before, the store used whatever directory it found under its name, and
// made files 0444 in directories 0755: another user who made
// /dev/shm/embcache first read every value and input kept there and
// replaced values before their commit, and every user read every value.

const nobody = localdirtest.Nobody

// TestAnotherUsersStoreDirectoryIsRefused: another user made the store's
// directory first (a fixed default name under /dev/shm). Open refuses it,
// names it, and writes nothing into it.
func TestAnotherUsersStoreDirectoryIsRefused(t *testing.T) {
	for _, mode := range []uint32{0o755, 0o777} {
		dir := filepath.Join(testDir(t), "embcache")
		localdirtest.Squat(t, dir, mode)
		s, err := Open(dir)
		if !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), dir) {
			t.Fatalf("a store directory of uid %d, mode %04o: %v, want ErrUnsafeDir naming it", nobody, mode, err)
		}
		if s != nil {
			t.Fatal("a store came with the error")
		}
		if names, _ := os.ReadDir(dir); len(names) != 0 {
			t.Fatalf("Open wrote into the refused directory: %v", names)
		}
	}
}

// TestWritableStoreDirectoryIsRefused: a store directory of the store's
// user that every user may write, or a group other than WithGroup's, is
// refused (ErrUnsafeDir; ErrOtherGroup for the group).
func TestWritableStoreDirectoryIsRefused(t *testing.T) {
	for _, c := range []struct {
		mode  uint32
		opts  []Option
		group bool
	}{
		{0o777, nil, false},
		{0o1777, nil, false},
		{0o770, nil, true},
		{0o2770, []Option{WithGroup("65534")}, true}, // the directory's group is the process's, not nobody's
	} {
		dir := filepath.Join(testDir(t), "embcache")
		if err := os.Mkdir(dir, 0); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(dir, c.mode); err != nil {
			t.Fatal(err)
		}
		if len(c.opts) > 0 && os.Geteuid() != 0 {
			continue
		}
		_, err := Open(dir, c.opts...)
		if !errors.Is(err, ErrUnsafeDir) || errors.Is(err, ErrOtherGroup) != c.group {
			t.Fatalf("mode %04o: %v, want ErrUnsafeDir (ErrOtherGroup: %v)", c.mode, err, c.group)
		}
		if mode, _ := localdirtest.ModeOf(t, dir); mode != c.mode {
			t.Fatalf("the refused directory's mode changed to %04o", mode)
		}
	}
}

// TestLinkedStoreDirectoryIsRefused: the store's name is a link (to a
// directory another user controls, or any other): refused, nothing
// written where it leads.
func TestLinkedStoreDirectoryIsRefused(t *testing.T) {
	target := testDir(t)
	dir := filepath.Join(testDir(t), "embcache")
	if err := os.Symlink(target, dir); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		os.Lchown(dir, nobody, nobody)
		os.Chown(target, nobody, nobody)
	}
	if _, err := Open(dir); !errors.Is(err, ErrUnsafeDir) {
		t.Fatalf("a linked store directory: %v, want ErrUnsafeDir", err)
	}
	if names, _ := os.ReadDir(target); len(names) != 0 {
		t.Fatalf("Open wrote where the link leads: %v", names)
	}
}

// TestAnotherUsersTenantDirectoryIsRefused: a tenant's directory in the
// store that another user owns (there before Open, or put there after
// it) is refused: no value is written into it, where its owner would
// read it and replace it.
func TestAnotherUsersTenantDirectoryIsRefused(t *testing.T) {
	dir := testDir(t)
	localdirtest.Squat(t, filepath.Join(dir, obj(1).Tenant), 0o777)
	if _, err := Open(dir); !errors.Is(err, ErrUnsafeDir) {
		t.Fatalf("a tenant directory of uid %d: Open: %v, want ErrUnsafeDir", nobody, err)
	}
	os.Remove(filepath.Join(dir, obj(1).Tenant))
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	localdirtest.Squat(t, filepath.Join(dir, obj(1).Tenant), 0o755)
	if _, err := s.Put(context.Background(), obj(1), testValue(100)); !errors.Is(err, ErrUnsafeDir) {
		t.Fatalf("a tenant directory of uid %d: Put: %v, want ErrUnsafeDir", nobody, err)
	}
	if names, _ := os.ReadDir(filepath.Join(dir, obj(1).Tenant)); len(names) != 0 {
		t.Fatalf("Put wrote into the refused directory: %v", names)
	}
}

// TestValuesAreTheOwnersOnly: a store made where every user may search
// (as /dev/shm/embcache is) keeps its directories 0700 and its values
// 0400: another user (nobody, a child process of its own) can neither
// list the store nor read a value, and nobody with the value's path in
// hand reads it either.
func TestValuesAreTheOwnersOnly(t *testing.T) {
	dir := filepath.Join(localdirtest.Dir(t), "embcache")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(context.Background(), obj(1), testValue(100)); err != nil {
		t.Fatal(err)
	}
	file := s.Path(obj(1))
	for path, want := range map[string]uint32{dir: 0o700, filepath.Dir(file): 0o700, file: 0o400,
		filepath.Join(dir, tmpDir): 0o700, filepath.Join(dir, proofDir): 0o700, filepath.Dir(s.proofs.path(obj(1))): 0o700} {
		if mode, _ := localdirtest.ModeOf(t, path); mode != want {
			t.Errorf("%s: mode %04o, want %04o", path, mode, want)
		}
	}
	for _, c := range []struct{ op, path string }{{localdirtest.List, dir}, {localdirtest.Read, file}} {
		if err := localdirtest.As(t, nobody, nobody, c.op, c.path); !errors.Is(err, fs.ErrPermission) {
			t.Fatalf("%s %s as uid %d: %v, want permission denied", c.op, c.path, nobody, err)
		}
	}
}

// TestAnEarlierStoresModesAreTightened: a store directory an earlier
// version left (0755 directories, 0444 files) is made the owner's only
// by Open: its values are no longer readable by other users.
func TestAnEarlierStoresModesAreTightened(t *testing.T) {
	dir := filepath.Join(localdirtest.Dir(t), "embcache")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(context.Background(), obj(1), testValue(100)); err != nil {
		t.Fatal(err)
	}
	file := s.Path(obj(1))
	for _, d := range []string{dir, filepath.Dir(file)} {
		os.Chmod(d, 0o755)
	}
	os.Chmod(file, 0o444)
	if err := localdirtest.As(t, nobody, nobody, localdirtest.Read, file); err != nil {
		t.Fatalf("the earlier modes: %v, want the file readable (else this test proves nothing)", err)
	}
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Dir(file)} {
		if mode, _ := localdirtest.ModeOf(t, d); mode != 0o700 {
			t.Fatalf("%s: mode %04o after Open, want 0700", d, mode)
		}
	}
	if err := localdirtest.As(t, nobody, nobody, localdirtest.Read, file); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("read as uid %d after Open: %v, want permission denied", nobody, err)
	}
}

// TestWithGroupLetsTheGroupRead: WithGroup gives the store's directories
// and values to a group (0750 set-group-ID, 0440) which may then read
// them, as vLLM's processes of another user map a hit; a process of
// another group cannot, and the temp files and proofs stay the owner's.
func TestWithGroupLetsTheGroupRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to act as another user")
	}
	const otherGroup = 4243
	for _, group := range []string{"65534", "nogroup"} {
		dir := filepath.Join(localdirtest.Dir(t), "embcache")
		s, err := Open(dir, WithGroup(group))
		if group == "nogroup" && err != nil {
			t.Logf("no group named nogroup here: %v", err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if s.Group() != nobody {
			t.Fatalf("Group() %d, want %d", s.Group(), nobody)
		}
		v := testValue(100)
		loc, err := s.Put(context.Background(), obj(1), v)
		if err != nil {
			t.Fatal(err)
		}
		file := s.Path(obj(1))
		for path, want := range map[string]uint32{dir: 0o2750, filepath.Dir(file): 0o2750, file: 0o440} {
			if mode, gid := localdirtest.ModeOf(t, path); mode != want || gid != nobody {
				t.Errorf("%s: mode %04o group %d, want %04o group %d", path, mode, gid, want, nobody)
			}
		}
		for _, d := range []string{filepath.Join(dir, tmpDir), filepath.Join(dir, proofDir)} {
			if mode, _ := localdirtest.ModeOf(t, d); mode != 0o700 {
				t.Errorf("%s: mode %04o, want 0700", d, mode)
			}
		}
		if err := localdirtest.As(t, nobody, nobody, localdirtest.Read, file); err != nil {
			t.Fatalf("read as a member of the group: %v", err)
		}
		if err := localdirtest.As(t, nobody, otherGroup, localdirtest.Read, file); !errors.Is(err, fs.ErrPermission) {
			t.Fatalf("read as uid %d of group %d: %v, want permission denied", nobody, otherGroup, err)
		}
		if err := localdirtest.As(t, nobody, nobody, localdirtest.Write, file); !errors.Is(err, fs.ErrPermission) {
			t.Fatalf("write as a member of the group: %v, want permission denied", err)
		}
		got, err := s.Get(context.Background(), loc)
		if err != nil {
			t.Fatal(err)
		}
		got.Close()
		if s.hashes.Load() != 0 {
			t.Fatalf("a value of the group's mode was hashed again (%d): its proof did not hold", s.hashes.Load())
		}
	}
	if _, err := Open(testDir(t), WithGroup("no-such-group-of-embcache")); err == nil {
		t.Fatal("an unknown group opened")
	}
}

// TestOneStoreDirectoryHasOneGroup: a process without the group (or with
// another) on a store directory another process gave a group is refused
// (ErrOtherGroup, not ErrUnsafeDir), and the directory is left as it is:
// it would have taken the group's processes' access away.
func TestOneStoreDirectoryHasOneGroup(t *testing.T) {
	group := strconv.Itoa(os.Getegid())
	dir := filepath.Join(testDir(t), "embcache")
	if _, err := Open(dir, WithGroup(group)); err != nil {
		t.Fatal(err)
	}
	opts := [][]Option{nil}
	if os.Geteuid() == 0 {
		opts = append(opts, []Option{WithGroup("65534")})
	}
	for _, o := range opts {
		_, err := Open(dir, o...)
		if !errors.Is(err, ErrOtherGroup) || errors.Is(err, ErrUnsafeDir) {
			t.Fatalf("%d options: %v, want ErrOtherGroup", len(o), err)
		}
		if mode, gid := localdirtest.ModeOf(t, dir); mode != 0o2750 || int(gid) != os.Getegid() {
			t.Fatalf("the refused store's directory changed: mode %04o group %d", mode, gid)
		}
	}
	if _, err := Open(dir, WithGroup(group)); err != nil {
		t.Fatalf("with the same group: %v", err)
	}
}
