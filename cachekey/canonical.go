package cachekey

import (
	"encoding/binary"
	"math"
)

// Canonical encoding, specified in docs/protocol.md section 1. Every
// integer is little-endian; every variable-length item is length-prefixed.

const (
	keyMagic   = "embcache/key/v1\x00"
	blockMagic = "embcache/blk/v1\x00"
)

// Mode separates the three key namespaces: a raw-bytes key can never equal
// a tensor or a token key, whatever the inputs.
type Mode uint8

// Key modes, as they appear on the wire.
const (
	ModeRawBytes Mode = 1
	ModeTensor   Mode = 2
	ModeTokens   Mode = 3
)

// String returns "raw-bytes", "decoded-tensor" or "tokens".
func (m Mode) String() string {
	switch m {
	case ModeRawBytes:
		return "raw-bytes"
	case ModeTensor:
		return "decoded-tensor"
	case ModeTokens:
		return "tokens"
	}
	return "Mode(?)"
}

// Field type codes of the config encoding.
const (
	typeInt64     = 1
	typeUint64    = 2
	typeString    = 3
	typeInt64s    = 4
	typeFloat64s  = 5
	byteOrderLE   = 1
	digestSize    = 32
	maxHeaderSize = 1 << 16
)

type encoder struct{ b []byte }

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) str(s string) { e.u32(uint32(len(s))); e.b = append(e.b, s...) }

func (e *encoder) field(num, typ uint8) { e.u8(num); e.u8(typ) }

func (e *encoder) int64Field(num uint8, v int64) { e.field(num, typeInt64); e.u64(uint64(v)) }
func (e *encoder) strField(num uint8, v string)  { e.field(num, typeString); e.str(v) }

func (e *encoder) floatsField(num uint8, vs []float64) {
	e.field(num, typeFloat64s)
	e.u32(uint32(len(vs)))
	for _, v := range vs {
		if v == 0 {
			v = 0 // folds -0 to +0: they normalise pixels identically
		}
		e.u64(math.Float64bits(v))
	}
}

// appendConfig appends the canonical encoding of a validated config.
func appendConfig(b []byte, c *PreprocessingConfig) []byte {
	e := encoder{b}
	e.int64Field(1, c.CacheSchemaVersion)
	e.strField(2, c.ModelID)
	e.strField(3, c.ModelRevision)
	e.strField(4, c.EncoderConfigHash)
	e.strField(5, c.ProcessorVersion)
	e.strField(6, c.ResizeMode)
	e.field(7, typeInt64s)
	e.u32(2)
	e.u64(uint64(c.ImageSize[0]))
	e.u64(uint64(c.ImageSize[1]))
	e.strField(8, c.CropMode)
	e.floatsField(9, c.NormalizeMean)
	e.floatsField(10, c.NormalizeStd)
	e.int64Field(11, c.AudioSampleRate)
	e.strField(12, c.AudioCodecVersion)
	e.strField(13, c.AudioCodecConfigHash)
	e.int64Field(14, c.VideoFrameStride)
	e.strField(15, c.InputDType)
	e.strField(16, c.Modality.String())
	e.field(17, typeUint64)
	e.u64(c.WeightEpoch)
	e.strField(18, c.Tenant)
	return e.b
}
