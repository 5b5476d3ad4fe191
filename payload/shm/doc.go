// Package shm is the same-node payload transport: encoded values live as
// files on tmpfs (/dev/shm/embcache by default) and are read by a
// read-only mmap, so a hit of any size costs a map, not a copy, and a
// holder that writes into a value faults instead of corrupting it.
//
// Writers write a temp file (space allocated first, so a full disk fails
// before anything is written) and rename it into place without replacing:
// the first writer wins and readers never see a partial file. Each file is
// the value's encoding followed by its 32-byte checksum, so Get checks the
// file against the Location's checksum without reading the data; WithVerifyData
// re-hashes the data on every Get as well. Receive writes a value streamed
// from another node the same way, hashing it as it writes, and puts it in
// place only if it matches the checksum it was sent for.
package shm
