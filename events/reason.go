package events

import (
	"errors"
	"fmt"
)

// BadReason says why a body did not decode: metrics count skipped events
// by it, so the set is small and fixed.
type BadReason uint8

// Reasons an event is skipped.
const (
	BadTooLarge  BadReason = iota + 1 // longer than MaxEventSize
	BadMalformed                      // not a msgpack map (not msgpack, truncated, another type)
	BadVersion                        // a map whose "v" is no version this reader knows (a newer writer's, or none)
	BadInvalid                        // this version, but a field has the wrong type or the kind lacks what it needs
)

// String returns "too_large", "malformed", "version" or "invalid".
func (r BadReason) String() string {
	switch r {
	case BadTooLarge:
		return "too_large"
	case BadMalformed:
		return "malformed"
	case BadVersion:
		return "version"
	case BadInvalid:
		return "invalid"
	}
	return fmt.Sprintf("BadReason(%d)", uint8(r))
}

// BadReasons lists every reason.
func BadReasons() []BadReason { return []BadReason{BadTooLarge, BadMalformed, BadVersion, BadInvalid} }

// DecodeError is the error Decode returns: why a body was refused. It
// wraps ErrBadEvent.
type DecodeError struct {
	Reason BadReason
	Err    error
}

func (e *DecodeError) Error() string { return e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

func badEvent(r BadReason, format string, args ...any) error {
	return &DecodeError{Reason: r, Err: fmt.Errorf("%w: "+format, append([]any{ErrBadEvent}, args...)...)}
}

// ReasonOf returns the reason of an error Decode returned (BadMalformed
// for any other error).
func ReasonOf(err error) BadReason {
	if de, ok := errors.AsType[*DecodeError](err); ok {
		return de.Reason
	}
	return BadMalformed
}
