package payload

import "errors"

var (
	// ErrInvalidValue is returned for a value that cannot be encoded: a
	// tensor whose shape disagrees with its data, a kind without its parts.
	ErrInvalidValue = errors.New("payload: invalid value")
	// ErrCorrupt is returned when bytes do not decode, or their size or
	// checksum differs from the Location's. Such bytes are never a value.
	ErrCorrupt = errors.New("payload: corrupt payload")
	// ErrNotFound is returned when a transport does not hold the object.
	ErrNotFound = errors.New("payload: object not found")
	// ErrNoSpace is returned when a store's byte budget or disk cannot take
	// the value; nothing is left half-written.
	ErrNoSpace = errors.New("payload: no space")
	// ErrTooLarge is returned for a value over a transport's size limit.
	ErrTooLarge = errors.New("payload: value too large")
	// ErrInvalidLocation is returned for a Location a transport cannot use.
	ErrInvalidLocation = errors.New("payload: invalid location")
	// ErrUnavailable is returned when a remote store cannot be reached.
	ErrUnavailable = errors.New("payload: store unavailable")
	// ErrStoreUnreachable is returned, with ErrUnavailable, when this
	// process cannot reach the store as a whole, whatever the object (a
	// Mooncake master that does not answer it, or a call into the store
	// that does not return in time, which the transport cannot tell
	// apart): it says nothing of the object, which the processes that
	// reach the store still read. A reader keeps the object's record
	// (docs/protocol.md 3, rule 5).
	ErrStoreUnreachable = errors.New("payload: store unreachable from this process")
	// ErrClosed is returned by calls on a closed store or transport.
	ErrClosed = errors.New("payload: closed")
	// ErrInvalidOption is returned by NewRouter for a bad argument or
	// option.
	ErrInvalidOption = errors.New("payload: invalid option")
	// ErrUntrusted is returned by a transport for a Location whose
	// address it was not configured to trust (httppull.WithPeers): a
	// record's address is anyone's who can write the record, and the
	// transport sends nothing there, credentials least of all.
	ErrUntrusted = errors.New("payload: untrusted address")
	// ErrNoTransport is returned by a Router for a Location whose
	// transport it has no reader for.
	ErrNoTransport = errors.New("payload: no transport for location")
)
