package shm

import (
	"fmt"

	"github.com/embcache/embcache/internal/localdir"
	"github.com/embcache/embcache/payload"
)

// Option configures a Store.
type Option func(*Store) error

// WithMaxBytes sets the byte budget; a Put past it is ErrNoSpace.
func WithMaxBytes(n int64) Option {
	return func(s *Store) error {
		if n <= 0 {
			return fmt.Errorf("%w: shm: max bytes must be > 0, got %d", payload.ErrInvalidOption, n)
		}
		s.maxBytes = n
		return nil
	}
}

// WithNode names the node in the Locations the store writes (default: the hostname).
func WithNode(node string) Option {
	return func(s *Store) error {
		if node == "" {
			return fmt.Errorf("%w: shm: empty node name", payload.ErrInvalidOption)
		}
		s.node = node
		return nil
	}
}

// WithVerifyData sets whether Get checks that a file's whole encoding
// hashes to its trailer, or only checks the trailer the writer left. On by
// default: a flipped byte, on tmpfs or by another process, is then a miss,
// never a hit. The hash is paid once per file version per node, by its
// writer or first reader, which leave a proof that later readers trust
// while the file is unchanged (docs/protocol.md section 2.3 has the threat
// model and the cost).
func WithVerifyData(on bool) Option {
	return func(s *Store) error { s.verifyData = on; return nil }
}

// WithGroup lets a group read the store's values: the processes of the
// node that map them and run as another user, such as vLLM's, which reach
// them through the node agent. group is a name or a number; this process
// must run as root or be a member of it. The store's directories are then
// 0750 and set-group-ID, of that group, and its files 0440. Without it
// (the default) they are the owner's only: directories 0700, files 0400.
// The store's temp files and proofs are the owner's only either way.
func WithGroup(group string) Option {
	return func(s *Store) error {
		gid, err := localdir.LookupGroup(group)
		if err != nil {
			return fmt.Errorf("%w: shm: %w", payload.ErrInvalidOption, err)
		}
		s.group = gid
		return nil
	}
}
