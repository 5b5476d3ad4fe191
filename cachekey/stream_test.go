package cachekey

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// The streamed keys are the keys of the same bytes in memory, for sizes
// around the copy buffer's and the hasher's chunk boundaries.
func TestStreamedKeysMatch(t *testing.T) {
	keyer, err := NewKeyer(imageConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 1023, 1024, 1025, 256 << 10, 256<<10 + 1, 3<<20 + 7} {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(i*7 + i>>9)
		}
		want, _ := keyer.RawBytes(data)
		got, err := keyer.RawBytesFrom(iotest.HalfReader(bytes.NewReader(data)))
		if err != nil || got != want {
			t.Fatalf("raw %d bytes: %v %v, want %v", n, got, err, want)
		}
		if n%4 != 0 {
			continue
		}
		shape := []int64{int64(n / 4)}
		want, _ = keyer.Tensor(Tensor{DType: Float32, Shape: shape, Data: data})
		var r io.Reader = bytes.NewReader(data)
		if n < 1<<20 {
			r = iotest.OneByteReader(r)
		}
		got, err = keyer.TensorFrom(Float32, shape, r)
		if err != nil || got != want {
			t.Fatalf("tensor %d bytes: %v %v, want %v", n, got, err, want)
		}
	}
}

func TestTensorFromRefusesWrongLength(t *testing.T) {
	keyer, _ := NewKeyer(imageConfig())
	for _, n := range []int{15, 17, 1 << 20} {
		if _, err := keyer.TensorFrom(Float32, []int64{4}, bytes.NewReader(make([]byte, n))); !errors.Is(err, ErrInvalidInput) {
			t.Fatalf("%d bytes for 16: %v, want ErrInvalidInput", n, err)
		}
	}
	// A reader cut short (a request body whose connection closed) is an
	// error, never the key of what arrived: before and after a chunk.
	for _, n := range []int{10, chunkSize + 10, 3 * chunkSize} {
		r := io.MultiReader(bytes.NewReader(make([]byte, n)), iotest.ErrReader(io.ErrUnexpectedEOF))
		if _, err := keyer.RawBytesFrom(r); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("reader cut short after %d bytes: %v", n, err)
		}
	}
}
