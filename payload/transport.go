package payload

import "context"

// Transport moves values between processes and nodes.
//
// Put stores v under obj and returns where it lies. A second Put of the
// same bytes succeeds without rewriting them. Objects are named by key, and
// a key's bytes change only when an invalidation (new weights) makes the
// old ones wrong: a Put of other bytes replaces them. Get fetches the value
// a Location describes and verifies its size and checksum: a mismatch is
// ErrCorrupt, never a value. The caller must Close the value it got. Delete
// removes the object if it still holds the bytes loc describes (its
// checksum): a value put in its place since is left alone. Deleting an
// absent object is not an error.
type Transport interface {
	Put(ctx context.Context, obj ObjectID, v *Value) (Location, error)
	Get(ctx context.Context, loc Location) (*Value, error)
	Delete(ctx context.Context, loc Location) error
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
