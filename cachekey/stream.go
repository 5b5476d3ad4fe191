package cachekey

import (
	"fmt"
	"io"
	"sync"

	"github.com/zeebo/blake3"
)

// copyBuffers hold the chunks a reader is hashed in: large enough that the
// hasher's SIMD paths see whole batches of 1 KiB chunks.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// digestOf hashes r to its end; it holds one buffer, whatever r's size.
func digestOf(r io.Reader) (digest [digestSize]byte, n uint64, err error) {
	h := blake3.New()
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	m, err := io.CopyBuffer(h, r, *buf)
	if err != nil {
		return digest, 0, err
	}
	h.Sum(digest[:0])
	return digest, uint64(m), nil
}

// RawBytesFrom is RawBytes of everything r yields, read in bounded memory
// (one 256 KiB buffer), so an input of any size can be keyed. An error of r
// is returned as it is; a tokens config is refused (ErrInvalidInput).
func (k *Keyer) RawBytesFrom(r io.Reader) (Key, error) {
	if k.cfg.Modality == ModalityTokens {
		return Key{}, fmt.Errorf("%w: a tokens config keys token sequences, not raw bytes", ErrInvalidInput)
	}
	digest, n, err := digestOf(r)
	if err != nil {
		return Key{}, err
	}
	return k.rawKey(n, digest), nil
}

// TensorFrom is Tensor of a tensor whose data r yields, read in bounded
// memory. The data must be exactly the bytes dtype and shape call for
// (ErrInvalidInput otherwise).
func (k *Keyer) TensorFrom(dtype DType, shape []int64, r io.Reader) (Key, error) {
	if k.cfg.Modality == ModalityTokens {
		return Key{}, fmt.Errorf("%w: a tokens config keys token sequences, not tensors", ErrInvalidInput)
	}
	want, err := ElementBytes(dtype, shape)
	if err != nil {
		return Key{}, err
	}
	// One byte past the size is read, so too long an input is told apart
	// from an exact one without reading it all.
	digest, n, err := digestOf(io.LimitReader(r, int64(want)+1))
	if err != nil {
		return Key{}, err
	}
	if n != want {
		if n > want {
			return Key{}, fmt.Errorf("%w: shape %v of %v needs %d bytes, data has more", ErrInvalidInput, shape, dtype, want)
		}
		return Key{}, fmt.Errorf("%w: shape %v of %v needs %d bytes, data has %d", ErrInvalidInput, shape, dtype, want, n)
	}
	return k.tensorKey(dtype, shape, n, digest), nil
}
