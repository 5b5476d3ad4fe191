package payload

import (
	"fmt"
	"sync"

	"github.com/embcache/embcache/cachekey"
)

// Kind is what a Value holds.
type Kind uint8

// Value kinds; the numbers are the wire codes.
const (
	// KindTensor is a dense tensor: an image or audio embedding.
	KindTensor Kind = 1
	// KindTokens is a token-id sequence: codec tokens of a voice reference.
	KindTokens Kind = 2
	// KindHiddenPrefix is token ids with their hidden states.
	KindHiddenPrefix Kind = 3
)

// String returns "tensor", "tokens" or "hidden-prefix".
func (k Kind) String() string {
	switch k {
	case KindTensor:
		return "tensor"
	case KindTokens:
		return "tokens"
	case KindHiddenPrefix:
		return "hidden-prefix"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// ParseKind is the inverse of String.
func ParseKind(s string) (Kind, error) {
	for k := KindTensor; k <= KindHiddenPrefix; k++ {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown kind %q", ErrInvalidValue, s)
}

// MaxTokens bounds a value's token sequence.
const MaxTokens = 1 << 28

// Value is what the cache stores for a key. Values are shared by every
// holder and must not be written to: a Value read through shm is a
// read-only mapping, and a write faults.
type Value struct {
	Kind   Kind
	Tensor cachekey.Tensor // KindTensor and KindHiddenPrefix
	Tokens []uint32        // KindTokens and KindHiddenPrefix

	release  func() error // unmaps or returns the buffer; nil for plain values
	once     sync.Once
	closeErr error
}

// NewTensor returns a tensor value over data (not copied).
func NewTensor(dtype cachekey.DType, shape []int64, data []byte) *Value {
	return &Value{Kind: KindTensor, Tensor: cachekey.Tensor{DType: dtype, Shape: shape, Data: data}}
}

// NewTokens returns a token-sequence value.
func NewTokens(tokens []uint32) *Value {
	return &Value{Kind: KindTokens, Tokens: tokens}
}

// NewHiddenPrefix returns a hidden-state prefix: tokens and their states.
func NewHiddenPrefix(tokens []uint32, dtype cachekey.DType, shape []int64, data []byte) *Value {
	return &Value{Kind: KindHiddenPrefix, Tokens: tokens, Tensor: cachekey.Tensor{DType: dtype, Shape: shape, Data: data}}
}

// Validate checks that the value has exactly the parts of its kind and
// that its tensor's shape, dtype and data agree. The error wraps
// ErrInvalidValue.
func (v *Value) Validate() error {
	hasTensor := v.Tensor.DType != 0 || v.Tensor.Shape != nil || v.Tensor.Data != nil
	switch v.Kind {
	case KindTensor:
		if len(v.Tokens) != 0 {
			return fmt.Errorf("%w: a tensor value has tokens", ErrInvalidValue)
		}
	case KindTokens:
		if hasTensor {
			return fmt.Errorf("%w: a tokens value has a tensor", ErrInvalidValue)
		}
		if len(v.Tokens) == 0 {
			return fmt.Errorf("%w: empty token sequence", ErrInvalidValue)
		}
	case KindHiddenPrefix:
		if len(v.Tokens) == 0 {
			return fmt.Errorf("%w: a hidden prefix without tokens", ErrInvalidValue)
		}
	default:
		return fmt.Errorf("%w: unknown kind %d", ErrInvalidValue, uint8(v.Kind))
	}
	if len(v.Tokens) > MaxTokens {
		return fmt.Errorf("%w: %d tokens, at most %d", ErrInvalidValue, len(v.Tokens), MaxTokens)
	}
	if v.Kind != KindTokens {
		if err := v.Tensor.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidValue, err)
		}
	}
	return nil
}

// Size is the value's encoded size in bytes: what it weighs in a cache and
// on the wire.
func (v *Value) Size() int64 {
	_, total := layout(len(v.Tensor.Shape), len(v.Tokens), len(v.Tensor.Data))
	return int64(total)
}

// Close releases what the value's bytes live in (an shm mapping, a pulled
// buffer); after it the value must not be used. Plain values need no
// Close. It is safe to call more than once.
func (v *Value) Close() error {
	v.once.Do(func() {
		if v.release != nil {
			v.closeErr = v.release()
		}
	})
	return v.closeErr
}

// WithRelease returns v set to call release on Close. Transports use it to
// tie a mapping's lifetime to the value.
func WithRelease(v *Value, release func() error) *Value {
	v.release = release
	return v
}
