package mooncake

import (
	"errors"
	"fmt"
	"time"

	"github.com/embcache/embcache/payload"
)

// Mooncake Store error codes this package maps.
const (
	codeNoAvailableHandle   = -200
	codeReplicaNotReady     = -703
	codeObjectNotFound      = -704
	codeObjectAlreadyExists = -705
	codeObjectHasLease      = -706
	codeLeaseExpired        = -707
	codeTransferFailed      = -800
	codeRPCFailed           = -900
	codeRPCTimeout          = -901
)

var (
	// ErrLibrary is returned when the library cannot be loaded or lacks a symbol.
	ErrLibrary = errors.New("mooncake: library unavailable")
	// ErrBusy is returned when the store refuses to remove an object that
	// a reader holds a lease on; retry later.
	ErrBusy = errors.New("mooncake: object leased by a reader")
	// ErrMasterUnreachable is returned while the store's master does not
	// answer: by the call that found it so (an RPC failure, or no answer
	// within Config.CallTimeout), and at once by every call after it until
	// a probe of the master is answered again. It comes with
	// payload.ErrStoreUnreachable and payload.ErrUnavailable.
	ErrMasterUnreachable = errors.New("mooncake: master unreachable")
)

// CodeError is a failed Mooncake call with its return code. It unwraps to
// the payload sentinel the code means (payload.ErrNotFound for -704,
// payload.ErrUnavailable for failed transfers, RPC failures and timeouts,
// ...).
type CodeError struct {
	Op   string
	Code int64
}

// Error names the call, its code and what the code means.
func (e *CodeError) Error() string { return "mooncake: " + e.detail() }

// detail is the error without the package prefix.
func (e *CodeError) detail() string {
	return fmt.Sprintf("%s returned %d (%s)", e.Op, e.Code, codeName(e.Code))
}

// Unwrap maps the code to a sentinel.
func (e *CodeError) Unwrap() error {
	switch e.Code {
	case codeObjectNotFound:
		return payload.ErrNotFound
	case codeObjectHasLease:
		return ErrBusy
	case codeLeaseExpired, codeTransferFailed, codeRPCFailed, codeRPCTimeout:
		return payload.ErrUnavailable
	}
	return nil
}

func codeName(code int64) string {
	switch code {
	case codeNoAvailableHandle:
		return "no space: no segment with room, or none mounted"
	case codeReplicaNotReady:
		return "replica not ready"
	case codeObjectNotFound:
		return "object not found"
	case codeObjectAlreadyExists:
		return "object already exists"
	case codeObjectHasLease:
		return "object has a lease"
	case codeLeaseExpired:
		return "lease expired"
	case codeTransferFailed:
		return "transfer failed: is the process holding the object's segment gone?"
	case codeRPCFailed:
		return "RPC failed"
	case codeRPCTimeout:
		return "RPC timed out"
	}
	return "error"
}

// masterError is a call failed because the master does not answer (cause:
// an RPC failure, or no answer in time), or refused at once while it does
// not (fast).
type masterError struct {
	master string
	since  time.Time // when a call first found the master unreachable
	cause  error
	fast   bool
}

func (e *masterError) Error() string {
	cause := e.cause.Error()
	if ce, ok := e.cause.(*CodeError); ok {
		cause = ce.detail()
	}
	if e.fast {
		return fmt.Sprintf("mooncake: master %s unreachable for %v (%s): failing at once until it answers",
			e.master, time.Since(e.since).Round(time.Millisecond), cause)
	}
	return fmt.Sprintf("mooncake: master %s unreachable: %s", e.master, cause)
}

func (e *masterError) Unwrap() []error {
	return []error{ErrMasterUnreachable, payload.ErrStoreUnreachable, payload.ErrUnavailable, e.cause}
}

// timeoutError is a call that did not return within its time.
type timeoutError struct {
	op    string
	after time.Duration
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("%s did not return within %v", e.op, e.after)
}

func (e *timeoutError) Unwrap() error { return payload.ErrUnavailable }

// masterDown reports whether a call's return code says the master did not
// answer.
func masterDown(code int64) bool { return code == codeRPCFailed || code == codeRPCTimeout }
