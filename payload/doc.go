// Package payload is the data plane of embcache: the values the cache
// holds, their checksums and their encoding, and the Transport interface
// that moves them between processes and nodes.
//
// A Value is a dense tensor, a token-id sequence, or a hidden-state prefix
// (token ids and a tensor). Its encoding (docs/protocol.md section 2) is
// canonical, so a value has exactly one encoding and one checksum, and it
// places the tensor data at a 64-byte-aligned offset, so a reader can map a
// file or a registered buffer and use the data where it lies.
//
// Transports: payload/shm (files on tmpfs, one node, zero-copy reads),
// payload/httppull (pure Go, across nodes) and payload/mooncake (cgo, build
// tag mooncake). Every Get verifies size and checksum: a mismatch is
// ErrCorrupt, never a value. The package knows nothing of NATS.
package payload
