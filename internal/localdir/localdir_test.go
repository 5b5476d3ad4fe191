package localdir_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/embcache/embcache/internal/localdir"
	"github.com/embcache/embcache/internal/localdir/localdirtest"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	localdirtest.Main()
	os.Exit(m.Run())
}

const nobody = localdirtest.Nobody

func stat(t *testing.T, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to give a directory to another user")
	}
}

// TestMakeCreatesOwnerOnly: a missing directory (and its missing parents)
// is made, the directory itself 0700 whatever the umask.
func TestMakeCreatesOwnerOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b", "store")
	old := unix.Umask(0)
	defer unix.Umask(old)
	if err := localdir.Make(dir, localdir.Private, localdir.NoGroup); err != nil {
		t.Fatal(err)
	}
	if st := stat(t, dir); st.Mode&0o7777 != 0o700 || int(st.Uid) != os.Geteuid() {
		t.Fatalf("made %s: mode %04o uid %d, want 0700 and uid %d", dir, st.Mode&0o7777, st.Uid, os.Geteuid())
	}
	// Made again: the same, nothing changed.
	if err := localdir.Make(dir, localdir.Private, localdir.NoGroup); err != nil {
		t.Fatal(err)
	}
}

// TestMakeTightensItsOwn: a directory of the process's user that others
// may read (an earlier version's 0755) is made owner-only.
func TestMakeTightensItsOwn(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755|os.ModeSetgid)
	if err := localdir.Make(dir, localdir.Private, localdir.NoGroup); err != nil {
		t.Fatal(err)
	}
	if st := stat(t, dir); st.Mode&0o7777 != 0o700 {
		t.Fatalf("mode %04o, want 0700", st.Mode&0o7777)
	}
}

// TestAnotherUsersDirectoryIsRefused: the squat. Another user made the
// directory first under the name the process uses; it is refused and
// left as it is, whatever its mode.
func TestAnotherUsersDirectoryIsRefused(t *testing.T) {
	needRoot(t)
	for _, mode := range []uint32{0o700, 0o755, 0o777} {
		dir := filepath.Join(t.TempDir(), "store")
		if err := os.Mkdir(dir, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		err := localdir.Make(dir, localdir.Private, localdir.NoGroup)
		var le *localdir.Error
		if !errors.Is(err, localdir.ErrUnsafe) || !errors.As(err, &le) || le.Path != dir {
			t.Fatalf("mode %04o of uid %d: Make: %v, want ErrUnsafe naming %s", mode, nobody, err, dir)
		}
		if _, err := localdir.Use(dir, localdir.Private, localdir.NoGroup); !errors.Is(err, localdir.ErrUnsafe) {
			t.Fatalf("mode %04o of uid %d: Use: %v, want ErrUnsafe", mode, nobody, err)
		}
		if st := stat(t, dir); st.Uid != nobody || st.Mode&0o7777 != mode {
			t.Fatalf("the refused directory was changed: uid %d mode %04o", st.Uid, st.Mode&0o7777)
		}
	}
}

// TestAboveAnotherUsersDirectoryIsRefused: a directory whose parent is
// another user's (who can rename it away and put their own in its place)
// is refused; a parent of root's that everyone may write (/tmp, /dev/shm,
// an emptyDir) is the system's, and is not.
func TestAboveAnotherUsersDirectoryIsRefused(t *testing.T) {
	needRoot(t)
	parent := filepath.Join(t.TempDir(), "theirs")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(parent, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "store")
	if err := localdir.Make(dir, localdir.Private, localdir.NoGroup); !errors.Is(err, localdir.ErrUnsafe) {
		t.Fatalf("below a directory of uid %d: %v, want ErrUnsafe", nobody, err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("made %s anyway: %v", dir, err)
	}
	// A link of theirs on the way, to a directory of root's: refused too.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if err := localdir.Make(filepath.Join(link, "store"), localdir.Private, localdir.NoGroup); !errors.Is(err, localdir.ErrUnsafe) {
		t.Fatalf("through a link of uid %d: %v, want ErrUnsafe", nobody, err)
	}

	open := filepath.Join(t.TempDir(), "emptydir")
	if err := os.Mkdir(open, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := localdir.Make(filepath.Join(open, "store"), localdir.Private, localdir.NoGroup); err != nil {
		t.Fatalf("below root's 0777 directory: %v", err)
	}
}

// TestWritableDirectoryIsRefused: a directory of the process's user that
// every user may write, or a group other than the configured one, is
// refused (another user may have put anything in it) and left as it is;
// one its configured group may write is taken.
func TestWritableDirectoryIsRefused(t *testing.T) {
	for _, c := range []struct {
		mode       uint32
		gid, group int
		other      bool // refused for its group
	}{
		{0o777, 0, localdir.NoGroup, false},
		{0o707, 0, 0, false},
		{0o1777, 0, localdir.NoGroup, false}, // sticky: the store's files are still others' to plant
		{0o770, 0, localdir.NoGroup, true},
		{0o770, nobody, 0, true},
	} {
		dir := filepath.Join(t.TempDir(), "store")
		if err := os.Mkdir(dir, 0); err != nil {
			t.Fatal(err)
		}
		if c.gid != 0 {
			if os.Geteuid() != 0 {
				continue
			}
			os.Chown(dir, -1, c.gid)
		}
		if err := unix.Chmod(dir, c.mode); err != nil {
			t.Fatal(err)
		}
		err := localdir.Make(dir, localdir.DirMode(c.group), c.group)
		if !errors.Is(err, localdir.ErrUnsafe) || errors.Is(err, localdir.ErrOtherGroup) != c.other {
			t.Fatalf("mode %04o group %d, configured %d: %v, want ErrUnsafe (ErrOtherGroup: %v)", c.mode, c.gid, c.group, err, c.other)
		}
		if st := stat(t, dir); st.Mode&0o7777 != c.mode {
			t.Fatalf("the refused directory was changed: mode %04o", st.Mode&0o7777)
		}
	}
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "store")
	if err := os.Mkdir(dir, 0); err != nil {
		t.Fatal(err)
	}
	os.Chown(dir, -1, nobody)
	unix.Chmod(dir, 0o770)
	if err := localdir.Make(dir, localdir.Shared, nobody); err != nil {
		t.Fatalf("writable by the configured group: %v", err)
	}
	if st := stat(t, dir); st.Mode&0o7777 != localdir.Shared || st.Gid != nobody {
		t.Fatalf("mode %04o group %d, want %04o group %d", st.Mode&0o7777, st.Gid, localdir.Shared, nobody)
	}
}

// TestLinkAndFileAreRefused: a link to a directory of the process's own,
// and a file, where the directory should be, are refused and left.
func TestLinkAndFileAreRefused(t *testing.T) {
	target := t.TempDir()
	link := filepath.Join(t.TempDir(), "store")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	for _, f := range []func() error{
		func() error { return localdir.Make(link, localdir.Private, localdir.NoGroup) },
		func() error { _, err := localdir.Use(link, localdir.Private, localdir.NoGroup); return err },
	} {
		if err := f(); !errors.Is(err, localdir.ErrUnsafe) {
			t.Fatalf("a link: %v, want ErrUnsafe", err)
		}
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode().Type() != fs.ModeSymlink {
		t.Fatalf("the link after: %v %v", fi, err)
	}
	file := filepath.Join(t.TempDir(), "store")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := localdir.Make(file, localdir.Private, localdir.NoGroup); !errors.Is(err, localdir.ErrUnsafe) {
		t.Fatalf("a file: %v, want ErrUnsafe", err)
	}
}

// TestUseLeavesAnExistingDirectory: Use checks an existing directory and
// leaves its mode; one its group could not search is an error when a
// group is configured; a missing one is made as Make makes it.
func TestUseLeavesAnExistingDirectory(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if created, err := localdir.Use(dir, localdir.Private, localdir.NoGroup); err != nil || created {
		t.Fatalf("Use: %v %v", created, err)
	}
	if st := stat(t, dir); st.Mode&0o7777 != 0o755 {
		t.Fatalf("Use changed the mode to %04o", st.Mode&0o7777)
	}
	os.Chmod(dir, 0o700)
	if _, err := localdir.Use(dir, localdir.Shared, nobody); err == nil || errors.Is(err, localdir.ErrUnsafe) {
		t.Fatalf("a 0700 directory for group %d: %v, want an error that it cannot reach it", nobody, err)
	}
	fresh := filepath.Join(dir, "sock")
	if created, err := localdir.Use(fresh, localdir.Private, localdir.NoGroup); err != nil || !created {
		t.Fatalf("Use of a missing one: %v %v", created, err)
	}
	if st := stat(t, fresh); st.Mode&0o7777 != 0o700 {
		t.Fatalf("made %04o", st.Mode&0o7777)
	}
}

// TestOthersCannotReadAndTheGroupCan: what is kept in a Private
// directory, another user cannot read; in a Shared one of group nogroup,
// a process of that group can, and one of another group cannot. Each
// read is a child process of that user's.
func TestOthersCannotReadAndTheGroupCan(t *testing.T) {
	needRoot(t)
	base := localdirtest.Dir(t)
	private, shared := filepath.Join(base, "private"), filepath.Join(base, "shared")
	if err := localdir.Make(private, localdir.Private, localdir.NoGroup); err != nil {
		t.Fatal(err)
	}
	if err := localdir.Make(shared, localdir.Shared, nobody); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{private, shared} {
		if err := os.WriteFile(filepath.Join(dir, "value"), []byte("secret"), 0o440); err != nil {
			t.Fatal(err)
		}
	}
	if st := stat(t, filepath.Join(shared, "value")); st.Gid != nobody {
		t.Fatalf("a file made in the shared directory has group %d, want %d (set-group-ID)", st.Gid, nobody)
	}
	const otherGroup = 4243
	for _, c := range []struct {
		dir  string
		gid  int
		read bool
	}{{private, nobody, false}, {shared, nobody, true}, {shared, otherGroup, false}} {
		for _, op := range []struct{ op, path string }{{localdirtest.List, c.dir}, {localdirtest.Read, filepath.Join(c.dir, "value")}} {
			err := localdirtest.As(t, nobody, c.gid, op.op, op.path)
			if c.read && err != nil || !c.read && !errors.Is(err, fs.ErrPermission) {
				t.Fatalf("%s %s as uid %d gid %d: %v, want read %v", op.op, op.path, nobody, c.gid, err, c.read)
			}
		}
	}
}

func TestLookupGroup(t *testing.T) {
	if g, err := localdir.LookupGroup(""); err != nil || g != localdir.NoGroup {
		t.Fatalf("\"\": %d %v", g, err)
	}
	if g, err := localdir.LookupGroup("no-such-group-of-embcache"); err == nil {
		t.Fatalf("an unknown group: %d", g)
	}
	egid := os.Getegid()
	if g, err := localdir.LookupGroup(strconv.Itoa(egid)); err != nil || g != egid {
		t.Fatalf("%d: %d %v", egid, g, err)
	}
	if os.Geteuid() == 0 {
		if g, err := localdir.LookupGroup("nogroup"); err == nil && g != nobody {
			t.Fatalf("nogroup: %d", g)
		}
	}
}
