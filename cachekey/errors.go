package cachekey

import "errors"

var (
	// ErrInvalidConfig is returned when a PreprocessingConfig leaves out a field
	// that its modality needs, or sets one that the modality must leave empty.
	ErrInvalidConfig = errors.New("cachekey: invalid preprocessing config")
	// ErrInvalidInput is returned for input that cannot be keyed: a tensor whose
	// shape and dtype disagree with its data, an unknown dtype, a block size of 0.
	ErrInvalidInput = errors.New("cachekey: invalid input")
	// ErrMalformedKey is returned by Parse for a string that is not 64
	// lowercase hex digits.
	ErrMalformedKey = errors.New("cachekey: malformed key")
)
