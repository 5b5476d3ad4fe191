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
// the value's encoding followed by its 32-byte checksum (the trailer). The
// first Get of a file in a process maps it and hashes the encoding: it must
// hash to the trailer, and the trailer must be the Location's checksum, so
// a flipped byte or a foreign file is payload.ErrCorrupt, never a value.
// Later Gets share that mapping while a value holds it and hash nothing
// (WithVerifyData(false) checks the trailer only; docs/protocol.md section
// 2.3 has the threat model and the cost). Receive writes a value streamed
// from another node the same way, hashing it as it writes, and puts it in
// place only if it matches the checksum it was sent for.
package shm
