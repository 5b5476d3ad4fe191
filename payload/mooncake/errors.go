package mooncake

import (
	"errors"
	"fmt"

	"github.com/embcache/embcache/payload"
)

// Mooncake Store error codes this package maps.
const (
	codeObjectNotFound      = -704
	codeObjectAlreadyExists = -705
	codeObjectHasLease      = -706
	codeLeaseExpired        = -707
	codeRPCFailed           = -900
	codeRPCTimeout          = -901
)

var (
	// ErrLibrary is returned when the library cannot be loaded or lacks a symbol.
	ErrLibrary = errors.New("mooncake: library unavailable")
	// ErrBusy is returned when the store refuses to remove an object that
	// a reader holds a lease on; retry later.
	ErrBusy = errors.New("mooncake: object leased by a reader")
)

// CodeError is a failed Mooncake call with its return code. It unwraps to
// the payload sentinel the code means (payload.ErrNotFound for -704,
// payload.ErrUnavailable for RPC failures and timeouts, ...).
type CodeError struct {
	Op   string
	Code int64
}

func (e *CodeError) Error() string {
	return fmt.Sprintf("mooncake: %s returned %d (%s)", e.Op, e.Code, codeName(e.Code))
}

// Unwrap maps the code to a sentinel.
func (e *CodeError) Unwrap() error {
	switch e.Code {
	case codeObjectNotFound:
		return payload.ErrNotFound
	case codeObjectHasLease:
		return ErrBusy
	case codeLeaseExpired, codeRPCFailed, codeRPCTimeout:
		return payload.ErrUnavailable
	}
	return nil
}

func codeName(code int64) string {
	switch code {
	case codeObjectNotFound:
		return "object not found"
	case codeObjectAlreadyExists:
		return "object already exists"
	case codeObjectHasLease:
		return "object has a lease"
	case codeLeaseExpired:
		return "lease expired"
	case codeRPCFailed:
		return "RPC failed"
	case codeRPCTimeout:
		return "RPC timed out"
	}
	return "error"
}
