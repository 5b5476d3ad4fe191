package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/embcache/embcache/internal/localdir"
)

// ListenOption configures ListenUnix.
type ListenOption func(*listenConfig) error

type listenConfig struct {
	group int // localdir.NoGroup: none
}

// WithSocketGroup lets a group connect to the socket: the processes of
// another user that are the agent's clients (vLLM's), the group the store
// gives its values to (shm.WithGroup, --shm-group). group is a name or a
// number; this process must run as root or be a member of it. The socket
// is then 0660 and of that group, and a directory ListenUnix makes for it
// 0750, set-group-ID, of that group. Without it the socket is 0600 in a
// directory it makes 0700: only the agent's own user connects.
func WithSocketGroup(group string) ListenOption {
	return func(c *listenConfig) error {
		gid, err := localdir.LookupGroup(group)
		if err != nil {
			return fmt.Errorf("agent: socket group: %w", err)
		}
		c.group = gid
		return nil
	}
}

// ListenUnix listens on the Unix socket path for Serve. Its directory must
// be this process's own: one owned by another user, a link, or one
// another user or a group other than the socket's may write is refused
// with an error matching shm.ErrUnsafeDir (and shm.ErrOtherGroup for the
// group) and left as it is, since whoever may write it could put a socket
// of their own in the agent's place. A missing directory is made (0700,
// or 0750 set-group-ID with WithSocketGroup); an existing one keeps its
// mode, and with a group must let it search it. ListenUnix replaces a
// socket file no one answers on (its agent exited without removing it),
// refuses one another agent serves on and a path that is not a socket,
// and gives the socket 0600 (0660 and the group, with WithSocketGroup).
func ListenUnix(path string, opts ...ListenOption) (net.Listener, error) {
	c := listenConfig{group: localdir.NoGroup}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if _, err := localdir.Use(filepath.Dir(path), localdir.DirMode(c.group), c.group); err != nil {
		return nil, fmt.Errorf("agent: socket directory: %w", err)
	}
	if conn, err := net.Dial("unix", path); err == nil {
		conn.Close()
		return nil, fmt.Errorf("%s: another agent is serving there", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		// Stale: its agent exited without removing it. Only a socket is
		// removed: a mistyped --socket naming a file of the user's took
		// it (a dial to a regular file is refused like a stale socket's).
		if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s: exists and is not a socket (%s)", path, fi.Mode())
		}
		os.Remove(path)
	}
	// The socket is made in a directory of its own (0700) and given its
	// mode there, then renamed into place: made at path, it would have the
	// process's umask's mode until the chmod, and another user could
	// connect in between (with a umask of 0, in a directory they can
	// search, such as /run).
	private, err := os.MkdirTemp(filepath.Dir(path), ".agent-socket-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(private)
	made := filepath.Join(private, "s")
	l, err := net.Listen("unix", made)
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	mode := os.FileMode(0o600)
	if c.group != localdir.NoGroup {
		mode = 0o660
		if err := os.Lchown(made, -1, c.group); err != nil {
			l.Close()
			return nil, err
		}
	}
	if err := os.Chmod(made, mode); err != nil {
		l.Close()
		return nil, err
	}
	if err := os.Rename(made, path); err != nil {
		l.Close()
		return nil, err
	}
	return &socketListener{Listener: l, path: path}, nil
}

// socketListener removes its socket file when closed, as a listener Listen
// made at its path would.
type socketListener struct {
	net.Listener
	path string
}

func (l *socketListener) Close() error {
	err := l.Listener.Close()
	os.Remove(l.path)
	return err
}
