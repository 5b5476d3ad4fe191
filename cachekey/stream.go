package cachekey

import (
	"fmt"
	"io"
	"sync"

	"github.com/zeebo/blake3"
)

// chunkSize is what a reader is hashed in: large enough that the hasher's
// SIMD paths see whole batches of 1 KiB chunks.
const chunkSize = 256 << 10

var chunks = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// chunk is one read: data, or the read's end (err, io.EOF at the end).
type chunk struct {
	buf *[]byte
	n   int
	err error
}

// digestOf hashes r to its end, in bounded memory (two chunks). An input
// longer than a chunk is read on a second goroutine while this one hashes
// what was read before: from a socket, the copy out of the kernel costs
// about what the hash does, and they overlap on two cores.
func digestOf(r io.Reader) (digest [digestSize]byte, n uint64, err error) {
	h := blake3.New()
	first := chunks.Get().(*[]byte)
	m, err := fill(r, *first)
	h.Write((*first)[:m])
	n = uint64(m)
	chunks.Put(first)
	switch err {
	case io.EOF: // all of it fit in one chunk
		h.Sum(digest[:0])
		return digest, n, nil
	case nil:
	default:
		return digest, 0, err
	}
	full := make(chan chunk, 1)
	free := make(chan *[]byte, 2)
	free <- chunks.Get().(*[]byte)
	free <- chunks.Get().(*[]byte)
	go func() { // ends at r's end or error, which the loop below always reads to
		for {
			b := <-free
			m, err := fill(r, *b)
			full <- chunk{b, m, err}
			if err != nil {
				return
			}
		}
	}()
	for c := range full {
		h.Write((*c.buf)[:c.n])
		n += uint64(c.n)
		if c.err == nil {
			free <- c.buf
			continue
		}
		chunks.Put(c.buf)
		chunks.Put(<-free)
		if c.err != io.EOF {
			return digest, 0, c.err
		}
		h.Sum(digest[:0])
		return digest, n, nil
	}
	panic("unreachable")
}

// fill reads into b until it is full (nil) or r ends (io.EOF) or fails.
// Unlike io.ReadFull it tells a clean end from a reader's own
// io.ErrUnexpectedEOF (a request body cut short).
func fill(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
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
