package payload

import "context"

// Transport moves values between processes and nodes.
//
// Put stores v under obj and returns where it lies. A second Put of the
// same bytes succeeds without rewriting them, but gives the object a new
// Generation. Objects are named by key, and a key's bytes change only when
// an invalidation (new weights) makes the old ones wrong: a Put of other
// bytes replaces them. Get fetches the value a Location describes and
// verifies its size and checksum: a mismatch is ErrCorrupt, never a value.
// The caller must Close the value it got.
//
// A delete is conditional on what its caller saw: Generation reads the
// object's generation before the caller decides (it reads the key's
// record), and Delete removes the object only if it still holds the bytes
// loc describes (its checksum) in that generation. A value put in its
// place since, or the same bytes put again since (a recompute that may
// commit them), is left alone. Deleting an absent object is not an error.
type Transport interface {
	Put(ctx context.Context, obj ObjectID, v *Value) (Location, error)
	Get(ctx context.Context, loc Location) (*Value, error)
	Generation(ctx context.Context, loc Location) (Generation, error)
	Delete(ctx context.Context, loc Location, seen Generation) error
}

// Generation names one put of an object in its store, as
// Transport.Generation reads it: every Put makes a new one, a Put of the
// bytes already there included. What it holds is the store's: a file's
// inode number and change time (shm), the number of a Put (MemoryStore).
// The zero Generation is no object; a store that keeps no generations
// (Mooncake) returns it for every object and ignores it in Delete.
type Generation struct {
	ID      uint64 // the file's inode number; the Put's number
	Changed int64  // the file's ctime, in nanoseconds since 1970
}

// Blob is a stored encoding: read-only bytes, valid until Close.
type Blob struct {
	Data     []byte
	Checksum Checksum
	release  func() error
}

// NewBlob returns a Blob over data; release (which may be nil) runs on Close.
func NewBlob(data []byte, sum Checksum, release func() error) *Blob {
	return &Blob{Data: data, Checksum: sum, release: release}
}

// Close releases the blob's bytes.
func (b *Blob) Close() error {
	if b.release == nil {
		return nil
	}
	r := b.release
	b.release = nil
	return r()
}
