package cachekey

import (
	"encoding/hex"
	"fmt"
)

// Size is the length of a Key in bytes: the whole BLAKE3-256 digest.
const Size = 32

// Key is a content address: BLAKE3-256 over a canonical message. The zero
// Key is never produced by the constructors.
type Key [Size]byte

// String returns the key as 64 lowercase hex digits.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// IsZero reports whether k is the zero Key.
func (k Key) IsZero() bool { return k == Key{} }

// MarshalText implements encoding.TextMarshaler.
func (k Key) MarshalText() ([]byte, error) {
	out := make([]byte, 2*Size)
	hex.Encode(out, k[:])
	return out, nil
}

// UnmarshalText implements encoding.TextUnmarshaler; it accepts exactly what
// String prints.
func (k *Key) UnmarshalText(text []byte) error {
	parsed, err := Parse(string(text))
	if err != nil {
		return err
	}
	*k = parsed
	return nil
}

// Parse reads a key printed by String: exactly 64 lowercase hex digits.
// Anything else, including upper case, is ErrMalformedKey, so a key has one
// spelling and a string with '.', '*', '>' or spaces can never become a key.
func Parse(s string) (Key, error) {
	var k Key
	if len(s) != 2*Size {
		return k, fmt.Errorf("%w: %d characters, want %d", ErrMalformedKey, len(s), 2*Size)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return k, fmt.Errorf("%w: byte %d is %q, want [0-9a-f]", ErrMalformedKey, i, c)
		}
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return k, fmt.Errorf("%w: %w", ErrMalformedKey, err)
	}
	return k, nil
}
