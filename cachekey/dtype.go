package cachekey

import (
	"fmt"
	"math/bits"
)

// DType is the element type of a tensor. Tensors are always little-endian.
type DType uint8

// The dtypes a tensor may have. The zero value is invalid.
const (
	Float32 DType = iota + 1
	Float16
	BFloat16
	Float64
	Int8
	Uint8
	Int16
	Int32
	Int64
	Bool
)

var dtypeInfo = [...]struct {
	name string
	size int
}{
	{"", 0},
	{"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {"float64", 8},
	{"int8", 1}, {"uint8", 1}, {"int16", 2}, {"int32", 4}, {"int64", 8}, {"bool", 1},
}

// Valid reports whether d is one of the defined dtypes.
func (d DType) Valid() bool { return d != 0 && int(d) < len(dtypeInfo) }

// Size is the size of one element in bytes, 0 for an invalid dtype.
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}

// String returns the dtype's wire name, as torch and numpy spell it ("float32").
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DType(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// ParseDType is the inverse of String.
func ParseDType(s string) (DType, error) {
	for i := 1; i < len(dtypeInfo); i++ {
		if dtypeInfo[i].name == s {
			return DType(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown dtype %q", ErrInvalidInput, s)
}

// MarshalText implements encoding.TextMarshaler.
func (d DType) MarshalText() ([]byte, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("%w: unknown dtype %d", ErrInvalidInput, uint8(d))
	}
	return []byte(d.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *DType) UnmarshalText(b []byte) error {
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// MaxDims bounds a tensor's rank.
const MaxDims = 16

// Tensor is a dense, contiguous, little-endian tensor.
type Tensor struct {
	DType DType
	Shape []int64
	Data  []byte
}

// Validate checks that the dtype is known, no dimension is negative, and
// the product of the shape times the element size is exactly len(Data).
// The error wraps ErrInvalidInput.
func (t Tensor) Validate() error {
	n, err := ElementBytes(t.DType, t.Shape)
	if err != nil {
		return err
	}
	if n != uint64(len(t.Data)) {
		return fmt.Errorf("%w: shape %v of %v needs %d bytes, data has %d", ErrInvalidInput, t.Shape, t.DType, n, len(t.Data))
	}
	return nil
}

// ElementBytes returns the number of data bytes a tensor of this dtype and
// shape holds, refusing unknown dtypes, negative dimensions and overflow.
func ElementBytes(d DType, shape []int64) (uint64, error) {
	if !d.Valid() {
		return 0, fmt.Errorf("%w: unknown dtype %d", ErrInvalidInput, uint8(d))
	}
	if len(shape) > MaxDims {
		return 0, fmt.Errorf("%w: %d dimensions, at most %d", ErrInvalidInput, len(shape), MaxDims)
	}
	n := uint64(d.Size())
	for i, dim := range shape {
		if dim < 0 {
			return 0, fmt.Errorf("%w: dimension %d is negative (%d)", ErrInvalidInput, i, dim)
		}
		hi, lo := bits.Mul64(n, uint64(dim))
		if hi != 0 || lo > 1<<62 {
			return 0, fmt.Errorf("%w: shape %v overflows", ErrInvalidInput, shape)
		}
		n = lo
	}
	return n, nil
}
