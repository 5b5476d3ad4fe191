package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/payload"
)

// RecordVersion is the version of the lease record this package writes.
const RecordVersion = 1

// State is a lease record's state.
type State uint8

// Record states.
const (
	StateComputing State = iota + 1
	StateCommitted
	// StateInvalidated is an invalidation's tombstone, under its own key
	// (docs/protocol.md 4.4): no value, the model and epoch invalidated.
	StateInvalidated
)

// String returns "computing", "committed" or "invalidated".
func (s State) String() string {
	switch s {
	case StateComputing:
		return "computing"
	case StateCommitted:
		return "committed"
	case StateInvalidated:
		return "invalidated"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// MarshalText implements encoding.TextMarshaler.
func (s State) MarshalText() ([]byte, error) {
	if s < StateComputing || s > StateInvalidated {
		return nil, fmt.Errorf("%w: state %d", ErrBadRecord, uint8(s))
	}
	return []byte(s.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *State) UnmarshalText(b []byte) error {
	switch string(b) {
	case "computing":
		*s = StateComputing
	case "committed":
		*s = StateCommitted
	case "invalidated":
		*s = StateInvalidated
	default:
		return fmt.Errorf("%w: unknown state %q", ErrBadRecord, b)
	}
	return nil
}

// Record is the JSON value of a key's lease, readable with `nats kv get`.
type Record struct {
	V         int       `json:"v"`
	State     State     `json:"state"`
	Owner     string    `json:"owner"` // <node>/<pid>/<nonce> of the process that reserved it
	Nonce     string    `json:"nonce"`
	Started   time.Time `json:"started"`
	Heartbeat time.Time `json:"heartbeat"`
	Model     string    `json:"model,omitempty"`
	Epoch     uint64    `json:"epoch,omitempty"`
	// Reserved is the revision of the reservation that computed the value:
	// readers refuse a committed record reserved before its model and
	// epoch's latest invalidation (docs/protocol.md 4.4). 0 in records of
	// earlier versions: older than any invalidation.
	Reserved uint64 `json:"reserved,omitempty"`

	// Set once committed.
	Location *payload.Location `json:"location,omitempty"`
	Size     int64             `json:"size,omitempty"`
	Checksum string            `json:"checksum,omitempty"`
	Kind     string            `json:"kind,omitempty"`
	DType    string            `json:"dtype,omitempty"`
	Shape    []int64           `json:"shape,omitempty"`
	Expires  time.Time         `json:"expires,omitzero"`
}

// DecodeRecord parses and checks the record stored under key. Anything
// that is not a record this version understands there is ErrBadRecord:
// wrong JSON, an unknown version or state, a committed record without a
// valid location, or a state its key does not hold. A tombstone's key
// (IsTombstoneKey) holds invalidated records alone, and every other key
// (a value's, the election's) computing and committed ones: a tombstone at
// a value's key is neither a value nor a compute to wait for, and a record
// at a tombstone's key that is not one says nothing of the invalidation.
func DecodeRecord(key string, b []byte) (Record, error) {
	r, err := decodeRecord(b)
	if err != nil {
		return Record{}, err
	}
	if (r.State == StateInvalidated) != IsTombstoneKey(key) {
		return Record{}, badRecord(events.BadInvalid, "state %v under the key %s", r.State, key)
	}
	return r, nil
}

// decodeRecord is DecodeRecord wherever the record is stored.
func decodeRecord(b []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		// Why, for the metrics: only now, off the path of good records.
		var probe struct {
			V int `json:"v"`
		}
		switch {
		case json.Unmarshal(b, &probe) != nil:
			return Record{}, badRecord(events.BadMalformed, "%v", err)
		case probe.V != RecordVersion:
			return Record{}, badRecord(events.BadVersion, "version %d, this reader knows %d", probe.V, RecordVersion)
		}
		return Record{}, badRecord(events.BadInvalid, "%v", err)
	}
	if r.V != RecordVersion {
		return Record{}, badRecord(events.BadVersion, "version %d, this reader knows %d", r.V, RecordVersion)
	}
	if r.Owner == "" {
		return Record{}, badRecord(events.BadInvalid, "no owner")
	}
	switch r.State {
	case StateComputing:
		if r.Location != nil {
			return Record{}, badRecord(events.BadInvalid, "a computing record with a location")
		}
	case StateInvalidated:
		if r.Location != nil || r.Model == "" {
			return Record{}, badRecord(events.BadInvalid, "a tombstone with a location or without a model")
		}
	case StateCommitted:
		if r.Location == nil {
			return Record{}, badRecord(events.BadInvalid, "a committed record without a location")
		}
		if err := r.Location.Validate(); err != nil {
			return Record{}, badRecord(events.BadInvalid, "%v", err)
		}
		if r.Size != r.Location.Size || r.Checksum != r.Location.Checksum.String() {
			return Record{}, badRecord(events.BadInvalid, "size or checksum disagree with the location")
		}
	default:
		return Record{}, badRecord(events.BadInvalid, "no state")
	}
	return r, nil
}

// badRecordError is a record that does not decode, and why. The reasons
// are the events' (events.BadReason): malformed (not a JSON object of a
// record), version (another RecordVersion), invalid (this version, but a
// field is wrong or missing).
type badRecordError struct {
	reason events.BadReason
	detail string
}

func badRecord(reason events.BadReason, format string, args ...any) error {
	return &badRecordError{reason: reason, detail: fmt.Sprintf(format, args...)}
}

func (e *badRecordError) Error() string { return ErrBadRecord.Error() + ": " + e.detail }

func (e *badRecordError) Unwrap() error { return ErrBadRecord }

// BadReason says why err's record did not decode (malformed for an error that
// is not a bad record's).
func BadReason(err error) events.BadReason {
	if e, ok := errors.AsType[*badRecordError](err); ok {
		return e.reason
	}
	return events.BadMalformed
}

// encode returns r's JSON, as it is stored. A record without a valid
// state does not marshal: ErrBadRecord.
func (r Record) encode() ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRecord, err)
	}
	return b, nil
}

// MayHaveExpired reports whether the committed record r may have expired
// on the server at now (by any process's clock): its Expires, set by its
// writer's clock, less two clock allowances (the writer's clock against
// the server that stamped it, and that server's against the one that
// expires it; docs/protocol.md 3.1). Nothing is written on such a record,
// a purge included: its expiry marker would wipe what comes next.
func (r Record) MayHaveExpired(now time.Time, allowance time.Duration) bool {
	return !r.Expires.IsZero() && !now.Before(r.Expires.Add(-2*allowance))
}

// Committed returns r turned into the committed record of a value at loc,
// expiring ttl after now.
func (r Record) Committed(loc payload.Location, v *payload.Value, now time.Time, ttl time.Duration) Record {
	r.State = StateCommitted
	r.Heartbeat = now
	r.Location = &loc
	r.Size = loc.Size
	r.Checksum = loc.Checksum.String()
	r.Kind = v.Kind.String()
	if v.Kind != payload.KindTokens {
		r.DType = v.Tensor.DType.String()
		r.Shape = v.Tensor.Shape
	}
	r.Expires = now.Add(ttl)
	return r
}
