package cachekey

import (
	"fmt"
	"slices"

	"github.com/zeebo/blake3"
)

// DefaultTokenBlockSize is the block size of token-sequence keys when the
// caller does not choose one; it matches vLLM's default prefix-cache block.
const DefaultTokenBlockSize = 16

// A Keyer makes keys for one validated PreprocessingConfig. It encodes the
// config once, so each key costs one hash of the input and one of a short
// header. A Keyer is immutable and safe for concurrent use.
type Keyer struct {
	cfg     PreprocessingConfig
	encoded []byte // canonical config encoding
}

// NewKeyer validates cfg and returns a Keyer for it. The error wraps
// ErrInvalidConfig and names the offending field.
func NewKeyer(cfg PreprocessingConfig) (*Keyer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.NormalizeMean = slices.Clone(cfg.NormalizeMean)
	cfg.NormalizeStd = slices.Clone(cfg.NormalizeStd)
	return &Keyer{cfg: cfg, encoded: appendConfig(nil, &cfg)}, nil
}

// Config returns a copy of the Keyer's config.
func (k *Keyer) Config() PreprocessingConfig {
	c := k.cfg
	c.NormalizeMean = slices.Clone(c.NormalizeMean)
	c.NormalizeStd = slices.Clone(c.NormalizeStd)
	return c
}

// Tenant returns the config's tenant, the namespace the keys live in.
func (k *Keyer) Tenant() string { return k.cfg.Tenant }

// header starts a key message: magic, mode, length-prefixed config.
func (k *Keyer) header(mode Mode, extra int) []byte {
	b := make([]byte, 0, len(keyMagic)+1+4+len(k.encoded)+extra)
	e := encoder{append(b, keyMagic...)}
	e.u8(uint8(mode))
	e.u32(uint32(len(k.encoded)))
	e.b = append(e.b, k.encoded...)
	return e.b
}

// RawBytes returns the key of an input given as the raw bytes the encoder
// decodes (a JPEG, a WAV, an MP4). This is the preferred mode: it is exact,
// and it is the cheapest.
// The error wraps ErrInvalidInput when the config is for tokens.
func (k *Keyer) RawBytes(data []byte) (Key, error) {
	if k.cfg.Modality == ModalityTokens {
		return Key{}, fmt.Errorf("%w: a tokens config keys token sequences, not raw bytes", ErrInvalidInput)
	}
	return k.rawKey(uint64(len(data)), blake3.Sum256(data)), nil
}

// rawKey is the key of n raw input bytes hashing to digest.
func (k *Keyer) rawKey(n uint64, digest [digestSize]byte) Key {
	e := encoder{k.header(ModeRawBytes, 8+digestSize)}
	e.u64(n)
	e.b = append(e.b, digest[:]...)
	return blake3.Sum256(e.b)
}

// Tensor returns the key of a decoded input tensor. Its dtype, shape and
// byte order are part of the key: the same bytes under another shape give
// another key. The error wraps ErrInvalidInput.
func (k *Keyer) Tensor(t Tensor) (Key, error) {
	if k.cfg.Modality == ModalityTokens {
		return Key{}, fmt.Errorf("%w: a tokens config keys token sequences, not tensors", ErrInvalidInput)
	}
	if err := t.Validate(); err != nil {
		return Key{}, err
	}
	return k.tensorKey(t.DType, t.Shape, uint64(len(t.Data)), blake3.Sum256(t.Data)), nil
}

// tensorKey is the key of a validated tensor of n data bytes hashing to digest.
func (k *Keyer) tensorKey(dtype DType, shape []int64, n uint64, digest [digestSize]byte) Key {
	name := dtype.String()
	e := encoder{k.header(ModeTensor, 4+len(name)+1+4+8*len(shape)+8+digestSize)}
	e.str(name)
	e.u8(byteOrderLE)
	e.u32(uint32(len(shape)))
	for _, d := range shape {
		e.u64(uint64(d))
	}
	e.u64(n)
	e.b = append(e.b, digest[:]...)
	return blake3.Sum256(e.b)
}

// Tokens returns the key of a token sequence (codec tokens of a voice
// reference, say). The key is a chain of block hashes, so the key of a
// sequence whose length is a multiple of blockSize equals the last entry of
// TokenPrefixKeys for any longer sequence that starts with it. The config's
// modality must be ModalityTokens. The error wraps ErrInvalidInput.
func (k *Keyer) Tokens(blockSize int, tokens []uint32) (Key, error) {
	keys, err := k.tokenChain(blockSize, tokens, true)
	if err != nil {
		return Key{}, err
	}
	return keys[len(keys)-1], nil
}

// TokenPrefixKeys returns the key of every whole-block prefix of tokens, in
// order: entry i is the key of tokens[:(i+1)*blockSize]. A trailing partial
// block has no prefix key. This is what a prefix-cache layer shares.
func (k *Keyer) TokenPrefixKeys(blockSize int, tokens []uint32) ([]Key, error) {
	return k.tokenChain(blockSize, tokens, false)
}

func (k *Keyer) tokenChain(blockSize int, tokens []uint32, partial bool) ([]Key, error) {
	if k.cfg.Modality != ModalityTokens {
		return nil, fmt.Errorf("%w: token keys need modality tokens, config has %v", ErrInvalidInput, k.cfg.Modality)
	}
	if blockSize < 1 || blockSize > 1<<20 {
		return nil, fmt.Errorf("%w: block size %d, want 1..%d", ErrInvalidInput, blockSize, 1<<20)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("%w: empty token sequence", ErrInvalidInput)
	}
	e := encoder{k.header(ModeTokens, 4)}
	e.u32(uint32(blockSize))
	prev := blake3.Sum256(e.b)

	keys := make([]Key, 0, len(tokens)/blockSize+1)
	buf := make([]byte, 0, len(blockMagic)+digestSize+4+4*blockSize)
	for start := 0; start < len(tokens); start += blockSize {
		end := min(start+blockSize, len(tokens))
		if end-start < blockSize && !partial {
			break
		}
		e := encoder{append(buf[:0], blockMagic...)}
		e.b = append(e.b, prev[:]...)
		e.u32(uint32(end - start))
		for _, t := range tokens[start:end] {
			e.u32(t)
		}
		prev = blake3.Sum256(e.b)
		keys = append(keys, prev)
	}
	return keys, nil
}

// FromRawBytes validates cfg and returns the raw-bytes key of data.
// For many inputs under one config, make a Keyer once.
func FromRawBytes(cfg PreprocessingConfig, data []byte) (Key, error) {
	k, err := NewKeyer(cfg)
	if err != nil {
		return Key{}, err
	}
	return k.RawBytes(data)
}

// FromTensor validates cfg and t and returns the decoded-tensor key of t.
func FromTensor(cfg PreprocessingConfig, t Tensor) (Key, error) {
	k, err := NewKeyer(cfg)
	if err != nil {
		return Key{}, err
	}
	return k.Tensor(t)
}

// FromTokens validates cfg and returns the key of a token sequence with
// DefaultTokenBlockSize blocks.
func FromTokens(cfg PreprocessingConfig, tokens []uint32) (Key, error) {
	k, err := NewKeyer(cfg)
	if err != nil {
		return Key{}, err
	}
	return k.Tokens(DefaultTokenBlockSize, tokens)
}
