package payload

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/embcache/embcache/cachekey"
	"github.com/zeebo/blake3"
)

// The encoding of docs/protocol.md section 2.
const (
	// Magic opens every encoded value.
	Magic = "EMBCVAL1"
	// PreludeSize is the fixed part of the header.
	PreludeSize = 64
	// DataAlign is the alignment of the tensor data inside an encoding.
	DataAlign = 64
	// Version is the encoding version this package writes and reads.
	Version = 1
)

// layout returns where the data starts and the total encoded size.
func layout(ndim, ntokens, ndata int) (dataOffset, total int) {
	head := PreludeSize + 8*ndim + 4*ntokens
	dataOffset = (head + DataAlign - 1) &^ (DataAlign - 1)
	return dataOffset, dataOffset + ndata
}

// DataOffset returns where v's tensor data starts in its encoding (a
// multiple of DataAlign): a reader that maps an encoded value finds the
// data there.
func DataOffset(v *Value) int64 {
	off, _ := layout(len(v.Tensor.Shape), len(v.Tokens), len(v.Tensor.Data))
	return int64(off)
}

// Header returns the encoding of v up to its data: prelude, shape, tokens
// and zero padding. Encode(v) is Header(v) followed by the tensor data,
// which lets a writer send the data from where it lies.
func Header(v *Value) ([]byte, error) {
	if err := v.Validate(); err != nil {
		return nil, err
	}
	t := v.Tensor
	off, total := layout(len(t.Shape), len(v.Tokens), len(t.Data))
	b := make([]byte, off)
	copy(b, Magic)
	binary.LittleEndian.PutUint16(b[8:], Version)
	b[10] = uint8(v.Kind)
	b[11] = uint8(t.DType)
	binary.LittleEndian.PutUint32(b[12:], uint32(len(t.Shape)))
	binary.LittleEndian.PutUint64(b[16:], uint64(len(v.Tokens)))
	binary.LittleEndian.PutUint64(b[24:], uint64(len(t.Data)))
	binary.LittleEndian.PutUint64(b[32:], uint64(off))
	binary.LittleEndian.PutUint64(b[40:], uint64(total))
	p := PreludeSize
	for _, d := range t.Shape {
		binary.LittleEndian.PutUint64(b[p:], uint64(d))
		p += 8
	}
	for _, tok := range v.Tokens {
		binary.LittleEndian.PutUint32(b[p:], tok)
		p += 4
	}
	return b, nil
}

// Encode returns the whole encoding of v in one new buffer.
func Encode(v *Value) ([]byte, error) {
	h, err := Header(v)
	if err != nil {
		return nil, err
	}
	out := make([]byte, len(h)+len(v.Tensor.Data))
	copy(out, h)
	copy(out[len(h):], v.Tensor.Data)
	return out, nil
}

// Checksum is the BLAKE3-256 of a value's whole encoding.
type Checksum [32]byte

// String returns the checksum as 64 lowercase hex digits.
func (c Checksum) String() string { return hex.EncodeToString(c[:]) }

// MarshalText implements encoding.TextMarshaler.
func (c Checksum) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (c *Checksum) UnmarshalText(b []byte) error {
	k, err := cachekey.Parse(string(b))
	if err != nil {
		return fmt.Errorf("%w: checksum: %w", ErrInvalidLocation, err)
	}
	*c = Checksum(k)
	return nil
}

// Sum returns the checksum of v's encoding without building it.
func Sum(v *Value) (Checksum, error) {
	h, err := Header(v)
	if err != nil {
		return Checksum{}, err
	}
	return sumParts(h, v.Tensor.Data), nil
}

func sumParts(header, data []byte) Checksum {
	hasher := blake3.New()
	hasher.Write(header)
	hasher.Write(data)
	var c Checksum
	hasher.Sum(c[:0])
	return c
}

// Verify checks that b is exactly size bytes with checksum sum, and
// decodes it. Any difference is ErrCorrupt. The value aliases b.
func Verify(b []byte, size int64, sum Checksum) (*Value, error) {
	if int64(len(b)) != size {
		return nil, fmt.Errorf("%w: %d bytes, location says %d", ErrCorrupt, len(b), size)
	}
	if got := Checksum(blake3.Sum256(b)); got != sum {
		return nil, fmt.Errorf("%w: checksum %v, location says %v", ErrCorrupt, got, sum)
	}
	return Decode(b)
}

// Decode parses an encoding without checking its checksum (Verify does).
// It accepts only the canonical encoding: exact length, zero padding and
// reserved bytes, a valid value. The tensor data aliases b; tokens are
// copied. The error wraps ErrCorrupt.
func Decode(b []byte) (*Value, error) {
	corrupt := func(format string, args ...any) (*Value, error) {
		return nil, fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(b) < PreludeSize {
		return corrupt("%d bytes, shorter than the %d-byte prelude", len(b), PreludeSize)
	}
	if string(b[:8]) != Magic {
		return corrupt("bad magic %q", b[:8])
	}
	if v := binary.LittleEndian.Uint16(b[8:]); v != Version {
		return corrupt("encoding version %d, this reader knows %d", v, Version)
	}
	kind, dtype := Kind(b[10]), cachekey.DType(b[11])
	ndim := binary.LittleEndian.Uint32(b[12:])
	ntok := binary.LittleEndian.Uint64(b[16:])
	ndata := binary.LittleEndian.Uint64(b[24:])
	off := binary.LittleEndian.Uint64(b[32:])
	total := binary.LittleEndian.Uint64(b[40:])
	for _, x := range b[48:PreludeSize] {
		if x != 0 {
			return corrupt("reserved bytes are not zero")
		}
	}
	if ndim > cachekey.MaxDims || ntok > MaxTokens || ndata > uint64(len(b)) {
		return corrupt("header out of range (ndim %d, tokens %d, data %d)", ndim, ntok, ndata)
	}
	wantOff, wantTotal := layout(int(ndim), int(ntok), int(ndata))
	if off != uint64(wantOff) || total != uint64(wantTotal) || uint64(len(b)) != total {
		return corrupt("layout: offset %d total %d in %d bytes, want offset %d total %d", off, total, len(b), wantOff, wantTotal)
	}
	v := &Value{Kind: kind}
	p := PreludeSize
	if kind != KindTokens {
		v.Tensor.DType = dtype
		v.Tensor.Shape = make([]int64, ndim)
		for i := range v.Tensor.Shape {
			v.Tensor.Shape[i] = int64(binary.LittleEndian.Uint64(b[p:]))
			p += 8
		}
		v.Tensor.Data = b[off:total:total]
	} else if dtype != 0 || ndim != 0 || ndata != 0 {
		return corrupt("a tokens value with a tensor part")
	}
	if ntok > 0 {
		v.Tokens = make([]uint32, ntok)
		for i := range v.Tokens {
			v.Tokens[i] = binary.LittleEndian.Uint32(b[p:])
			p += 4
		}
	}
	for _, x := range b[p:off] {
		if x != 0 {
			return corrupt("padding is not zero")
		}
	}
	if err := v.Validate(); err != nil {
		return corrupt("%v", err)
	}
	return v, nil
}
