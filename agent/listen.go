package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// ListenUnix listens on the Unix socket path for Serve: it makes the
// directory, replaces a socket file no one answers on (its agent exited
// without removing it), refuses one another agent serves on and a path
// that is not a socket, and lets the socket's group connect (0660).
func ListenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
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
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
