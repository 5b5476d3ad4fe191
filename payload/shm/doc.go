// Package shm is the same-node payload transport: encoded values live as
// files on tmpfs (/dev/shm/embcache by default) and are read by a
// read-only mmap, so a hit of any size costs a map, not a copy, and a
// holder that writes into a value faults instead of corrupting it.
//
// Writers write a temp file (space allocated first, so a full disk fails
// before anything is written) and rename it into place: without replacing
// a file of the same bytes (the first writer wins), replacing one of other
// bytes (the key's value from before an invalidation); readers never see a
// partial file, and those that mapped a replaced file keep its bytes. Each file is
// the value's encoding followed by its 32-byte checksum (the trailer).
//
// A Get serves a file only if its encoding hashes to its trailer and the
// trailer is the Location's checksum, so a flipped byte or a foreign file
// is payload.ErrCorrupt, never a value. The hash is paid once per file
// version per node: the writer, which hashed the bytes it wrote, or else
// the first reader, leaves a proof beside the values naming the file's
// inode, size, mode and ctime; every Store of the same user on the node
// trusts it while the file is unchanged (a change moves its ctime, which no
// user can set). Only read-only files of the Store's user are proved;
// others are hashed at every fresh mapping. Gets of one file share one
// mapping (WithVerifyData(false) checks the trailer only; docs/protocol.md
// section 2.3 has the threat model and the cost). Receive writes a value streamed from another node the same way,
// hashing it as it writes, and puts it in place only if it matches the
// checksum it was sent for.
//
// The store's directory and every directory in it must be the process's
// own: Open refuses one owned by another user, a link, or one another user
// may write (ErrUnsafeDir; ErrOtherGroup for a group other than the
// store's), since a user who made /dev/shm/embcache first could read every
// value and replace one before its commit. Its files are the owner's only
// (directories 0700, values 0400) unless WithGroup gives a group read
// access (0750 set-group-ID, 0440): the processes of another user that map
// the values, as vLLM's do through the node agent.
//
// A delete is of the file's generation its caller saw (Generation: its
// inode and ctime) before it decided: a Put of the same bytes since moves
// the file's times, a new generation, and the delete leaves it. Puts that
// keep or replace a file, and deletes, take the file's flock, so they do
// not interleave (docs/protocol.md section 2.4).
package shm
