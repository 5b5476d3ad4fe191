// Package localdir makes or checks the directories a process keeps its
// node-local files in (the shm payload store, the agent's slots, the
// agent's socket) so that no other local user can read or change what it
// keeps there unless a group is configured for it.
//
// The directory the process uses must be its own: owned by its effective
// user, a directory and not a symbolic link to one, writable by no other
// user, and writable by a group only if that group is the configured one.
// Another user who made the directory first under a name the process
// uses (a fixed default under /dev/shm or /run) would otherwise read what
// the process writes there and change it under it. The directories above
// it are the system's or the process's: each must be owned by root or by
// the process's user (one owned by another user lets that user replace
// everything below it); their modes are not checked, so /dev/shm, /tmp
// or a Kubernetes emptyDir, which everyone may write, do.
//
// Make is for a directory the process owns outright (the store, the
// slots): it is given exactly the mode and group asked for, tightening
// what an earlier version left. Use is for one it may share with other
// uses (a socket's directory, which may be /run or a home): a missing one
// is made as Make would, an existing one is checked and left as it is.
package localdir

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

var (
	// ErrUnsafe is matched by every *Error: a directory refused because
	// another local user could read or change what is kept in it.
	ErrUnsafe = errors.New("localdir: unsafe directory")
	// ErrOtherGroup is matched by an *Error whose directory a group other
	// than the configured one (or any group, with none configured) may
	// write. It matches ErrUnsafe too.
	ErrOtherGroup = errors.New("localdir: a group other than the configured one")
)

// NoGroup is the group argument for "no group configured": directories
// are the owner's only.
const NoGroup = -1

// Error is a refused directory: which, and why. It matches ErrUnsafe, and
// ErrOtherGroup when a group is the reason (errors.Is).
type Error struct {
	Path   string
	Reason string
	group  bool
}

func (e *Error) Error() string { return e.Path + ": " + e.Reason }

// Is reports whether target is ErrUnsafe, or ErrOtherGroup for a group's
// refusal.
func (e *Error) Is(target error) bool {
	return target == ErrUnsafe || e.group && target == ErrOtherGroup
}

// Modes of the directories and files this package's callers make. Go's
// os.FileMode keeps set-group-ID and sticky in bits of its own
// (os.ModeSetgid), so modes here are the kernel's (unix.S_ISGID).
const (
	// Private is an owner-only directory.
	Private = 0o700
	// Shared is a directory whose group may read and search it; its
	// set-group-ID bit gives what is made in it the directory's group.
	Shared = 0o750 | unix.S_ISGID
)

// DirMode is Private without a group, Shared with one.
func DirMode(group int) uint32 {
	if group == NoGroup {
		return Private
	}
	return Shared
}

// FileMode is a read-only file's mode: 0400 without a group, 0440 with one.
func FileMode(group int) uint32 {
	if group == NoGroup {
		return 0o400
	}
	return 0o440
}

// Make makes path a directory of mode (permission bits, unix.S_ISGID,
// unix.S_ISVTX) and group (NoGroup: the group is left as it comes),
// creating it and its missing parents (0755, as os.MkdirAll does)
// if needed. An existing one is checked first: an unsafe one is an
// *Error (ErrUnsafe, ErrOtherGroup) and is left as it is; a safe one
// is given mode and group exactly. Setting the group needs root or
// membership of it.
func Make(path string, mode uint32, group int) error {
	_, err := ensure(path, mode, group, true)
	return err
}

// Use is Make for a directory the process may share with other uses: a
// missing one is made as Make makes it and reported (created); an
// existing one is checked as Make checks it, and its mode and group are
// left as they are. With a group, an existing directory must let the
// group search it (its group's search bit, or everyone's), or the group's
// members could not reach what the caller puts in it: an error that is
// not an *Error.
func Use(path string, mode uint32, group int) (created bool, err error) {
	return ensure(path, mode, group, false)
}

func ensure(path string, mode uint32, group int, exact bool) (created bool, err error) {
	if !filepath.IsAbs(path) {
		if path, err = filepath.Abs(path); err != nil {
			return false, err
		}
	}
	path = filepath.Clean(path)
	// Checked before its missing parents are made (a link of another
	// user's above it must not lead even a mkdir elsewhere), and after.
	if err := checkAncestors(path, true); err != nil {
		return false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	if err := checkAncestors(path, false); err != nil {
		return false, err
	}
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			err := unix.Mkdir(path, mode&0o777)
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return false, &os.PathError{Op: "mkdir", Path: path, Err: err}
			}
			created = err == nil
			continue // opened and checked as any other: another may have made it first
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return false, notADirectory(path)
		}
		if err != nil {
			return false, &os.PathError{Op: "open", Path: path, Err: err}
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return false, &os.PathError{Op: "stat", Path: path, Err: err}
		}
		if err := safe(path, &st, group); err != nil {
			return false, err
		}
		if exact || created {
			return created, set(fd, path, &st, mode, group)
		}
		if group != NoGroup && st.Mode&unix.S_IXOTH == 0 && (st.Mode&unix.S_IXGRP == 0 || int(st.Gid) != group) {
			return false, fmt.Errorf("%s: group %d cannot reach what is in it (mode %04o, group %d): "+
				"make it searchable by that group, or use a directory of its own", path, group, st.Mode&0o7777, st.Gid)
		}
		return false, nil
	}
}

// Made reports whether path is already a directory Make(path, mode,
// group) would leave as it is, looking at it alone (one lstat, not the
// directories above it): the fast path of a caller that makes the same
// directory often, after it made the one above.
func Made(path string, mode uint32, group int) bool {
	var st unix.Stat_t
	return unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && int(st.Uid) == os.Geteuid() &&
		st.Mode&0o7777 == mode && (group == NoGroup || int(st.Gid) == group)
}

// safe refuses a directory another user may change: not a directory (a
// link to one), another user's, writable by every user, or writable by a
// group other than the configured one.
func safe(path string, st *unix.Stat_t, group int) error {
	euid := os.Geteuid()
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return &Error{Path: path, Reason: "is a symbolic link: refused"}
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return &Error{Path: path, Reason: "is not a directory: refused"}
	case int(st.Uid) != euid:
		return &Error{Path: path, Reason: fmt.Sprintf("is owned by uid %d, not by this process's user (uid %d): "+
			"another user may have made it first; remove it, or give a directory of this user's", st.Uid, euid)}
	case st.Mode&unix.S_IWOTH != 0:
		return &Error{Path: path, Reason: fmt.Sprintf("every local user may write it (mode %04o): refused", st.Mode&0o7777)}
	case st.Mode&unix.S_IWGRP != 0 && (group == NoGroup || int(st.Gid) != group):
		configured := "no group is configured"
		if group != NoGroup {
			configured = fmt.Sprintf("the configured group is %d", group)
		}
		return &Error{Path: path, group: true, Reason: fmt.Sprintf("group %d may write it (mode %04o), and %s: refused",
			st.Gid, st.Mode&0o7777, configured)}
	}
	return nil
}

// notADirectory is the *Error for what open(O_DIRECTORY|O_NOFOLLOW)
// refused: a link, or something else than a directory.
func notADirectory(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	return safe(path, &st, NoGroup)
}

// checkAncestors refuses path if a directory above it, as named or as its
// links lead, is owned by a user other than root and this process's:
// that user could rename path away and put a directory of its own there.
// Their modes are the system's business. With missing, a directory that
// does not exist yet is skipped, and links are not followed.
func checkAncestors(path string, missing bool) error {
	euid := uint32(os.Geteuid())
	check := func(p string) error {
		for d := filepath.Dir(p); ; d = filepath.Dir(d) {
			var st unix.Stat_t
			err := unix.Lstat(d, &st)
			if err != nil && !(missing && errors.Is(err, unix.ENOENT)) {
				return &os.PathError{Op: "lstat", Path: d, Err: err}
			}
			if err == nil && st.Uid != 0 && st.Uid != euid {
				return &Error{Path: path, Reason: fmt.Sprintf("%s, above it, is owned by uid %d, which can replace what is below it: refused", d, st.Uid)}
			}
			if d == filepath.Dir(d) {
				return nil
			}
		}
	}
	if err := check(path); err != nil || missing {
		return err
	}
	real, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return err
	}
	if real == filepath.Dir(path) {
		return nil
	}
	return check(filepath.Join(real, filepath.Base(path)))
}

// set gives the open directory fd (path; st its state) mode and group.
func set(fd int, path string, st *unix.Stat_t, mode uint32, group int) error {
	if group != NoGroup && int(st.Gid) != group {
		if err := unix.Fchown(fd, -1, group); err != nil {
			return fmt.Errorf("%s: giving it group %d: %w (the process must be root or a member of the group)", path, group, err)
		}
	}
	if st.Mode&0o7777 != mode {
		if err := unix.Fchmod(fd, mode); err != nil {
			return &os.PathError{Op: "chmod", Path: path, Err: err}
		}
	}
	var now unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil {
		return &os.PathError{Op: "stat", Path: path, Err: err}
	}
	// The kernel drops set-group-ID silently for a process outside the group.
	if now.Mode&0o7777 != mode || group != NoGroup && int(now.Gid) != group {
		return fmt.Errorf("%s: mode %04o group %d after setting mode %04o group %d", path, now.Mode&0o7777, now.Gid, mode, group)
	}
	return nil
}

// LookupGroup returns the group s names, by name or number ("": NoGroup).
// This process must be able to give its files that group: it runs as
// root, or the group is one of its groups.
func LookupGroup(s string) (int, error) {
	if s == "" {
		return NoGroup, nil
	}
	gid, err := strconv.Atoi(s)
	if err != nil {
		g, lerr := user.LookupGroup(s)
		if lerr != nil {
			return 0, fmt.Errorf("group %q: %w", s, lerr)
		}
		if gid, err = strconv.Atoi(g.Gid); err != nil {
			return 0, fmt.Errorf("group %q: gid %q: %w", s, g.Gid, err)
		}
	}
	if gid < 0 {
		return 0, fmt.Errorf("group %q: a gid is not negative", s)
	}
	if os.Geteuid() == 0 || os.Getegid() == gid {
		return gid, nil
	}
	groups, err := os.Getgroups()
	if err != nil {
		return 0, fmt.Errorf("group %q: %w", s, err)
	}
	if !slices.Contains(groups, gid) {
		return 0, fmt.Errorf("group %q (%d): this process (uid %d) is not a member of it, so it cannot give its files that group", s, gid, os.Geteuid())
	}
	return gid, nil
}
