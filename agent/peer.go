package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// ErrUntrustedAgent is returned by a Client's calls when the process
// answering on the socket runs as a user the client does not trust to be
// its agent: neither the client's own user, nor root, nor one named with
// WithAgentUID. Nothing is sent to it: it would read the inputs the
// client keys, and could answer with any value. A socket path is trusted
// only as far as its directory is (the agent refuses one another user may
// write, but a client cannot tell whether an agent started at all).
var ErrUntrustedAgent = errors.New("agent: the process on the socket is not a trusted agent")

// DialOption configures Dial.
type DialOption func(*dialConfig)

type dialConfig struct {
	trusted []uint32 // the users an agent may run as, besides this process's and root
}

// WithAgentUID trusts an agent that runs as user uid, besides one running
// as this process's user or as root: an agent run as a user of its own,
// whose clients are in its --shm-group.
func WithAgentUID(uid uint32) DialOption {
	return func(c *dialConfig) { c.trusted = append(c.trusted, uid) }
}

// checkPeer returns an error wrapping ErrUntrustedAgent unless the process
// that listens on conn (SO_PEERCRED: its credentials when it listened)
// runs as a trusted user.
func (c *dialConfig) checkPeer(socket string, conn net.Conn) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("%w: %T is not a Unix socket", ErrUntrustedAgent, conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("agent: the credentials of the process on the socket: %w", cerr)
	}
	if cred.Uid == 0 || cred.Uid == uint32(os.Geteuid()) || slices.Contains(c.trusted, cred.Uid) {
		return nil
	}
	return fmt.Errorf("%w: the process on %s runs as uid %d (pid %d); trusted: this process's user (%d), root, and WithAgentUID's %v",
		ErrUntrustedAgent, socket, cred.Uid, cred.Pid, os.Geteuid(), c.trusted)
}
