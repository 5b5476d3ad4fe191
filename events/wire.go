package events

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// SchemaVersion is the version of the event body Encode writes. Decode
// also reads version 1, the body written before the wire form was fixed
// (docs/protocol.md section 4.2).
const SchemaVersion = 2

// MaxEventSize bounds an event body; real ones are a few hundred bytes.
const MaxEventSize = 64 << 10

// wireEvent is the body of version 2, field by field as docs/protocol.md
// section 4 states it: the keys in this order, the omitempty ones left out
// when zero, integers in their shortest form, keys and checksums as 32-byte
// bin, times as int nanoseconds since the Unix epoch.
type wireEvent struct {
	V        uint8         `msgpack:"v"`
	Kind     Kind          `msgpack:"kind"`
	Tenant   str           `msgpack:"tenant"`
	Key      bin32         `msgpack:"key"`
	Model    str           `msgpack:"model,omitempty"`
	Epoch    uint64        `msgpack:"epoch,omitempty"`
	Node     str           `msgpack:"node,omitempty"`
	Time     int64         `msgpack:"time"`
	Expires  int64         `msgpack:"expires,omitempty"`
	Location *wireLocation `msgpack:"location,omitempty"`
	Cause    Cause         `msgpack:"cause,omitempty"`
	Reason   str           `msgpack:"reason,omitempty"`
}

type wireLocation struct {
	Transport str   `msgpack:"transport"`
	Node      str   `msgpack:"node"`
	Address   str   `msgpack:"address,omitempty"`
	Object    str   `msgpack:"object"`
	Size      int64 `msgpack:"size"`
	Checksum  bin32 `msgpack:"checksum"`
}

// str and bin32 are the body's str and 32-byte bin fields: msgpack/v5
// would read either type as the other (and nil as empty), which the
// protocol does not allow.
type (
	str   string
	bin32 [32]byte
)

func (s *str) DecodeMsgpack(dec *msgpack.Decoder) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	if !msgpcode.IsString(c) {
		return fmt.Errorf("msgpack code %#x where a str belongs", c)
	}
	v, err := dec.DecodeString()
	*s = str(v)
	return err
}

func (b bin32) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.EncodeBytes(b[:]) }

func (b *bin32) DecodeMsgpack(dec *msgpack.Decoder) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	if !msgpcode.IsBin(c) {
		return fmt.Errorf("msgpack code %#x where a bin belongs", c)
	}
	v, err := dec.DecodeBytes()
	if err != nil {
		return err
	}
	if len(v) != len(b) {
		return fmt.Errorf("bin of %d bytes, want %d", len(v), len(b))
	}
	copy(b[:], v)
	return nil
}

// v1Event is the body of version 1: Go field names in the location, the
// key and checksum as bin holding hex characters, times as the timestamp
// extension (-1).
type v1Event struct {
	V        int               `msgpack:"v"`
	Kind     Kind              `msgpack:"kind"`
	Tenant   string            `msgpack:"tenant"`
	Key      cachekey.Key      `msgpack:"key"`
	Model    string            `msgpack:"model"`
	Epoch    uint64            `msgpack:"epoch"`
	Node     string            `msgpack:"node"`
	Time     time.Time         `msgpack:"time"`
	Expires  time.Time         `msgpack:"expires"`
	Location *payload.Location `msgpack:"location"`
	Cause    Cause             `msgpack:"cause"`
	Reason   string            `msgpack:"reason"`
}

// Encode validates e and returns its body (version SchemaVersion).
func Encode(e *Event) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	w := wireEvent{V: SchemaVersion, Kind: e.Kind, Tenant: str(e.Tenant), Key: bin32(e.Key), Model: str(e.Model),
		Epoch: e.Epoch, Node: str(e.Node), Time: e.Time.UnixNano(), Cause: e.Cause, Reason: str(e.Reason)}
	if !e.Expires.IsZero() {
		w.Expires = e.Expires.UnixNano()
	}
	if l := e.Location; l != nil {
		w.Location = &wireLocation{Transport: str(l.Transport), Node: str(l.Node), Address: str(l.Address),
			Object: str(l.Object), Size: l.Size, Checksum: bin32(l.Checksum)}
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(&w); err != nil {
		return nil, fmt.Errorf("events: encode: %w", err)
	}
	return buf.Bytes(), nil
}

// Decode parses and validates a body of version 1 or 2. The error wraps
// ErrBadEvent.
func Decode(b []byte) (e Event, err error) {
	if len(b) > MaxEventSize {
		return Event{}, badEvent(BadTooLarge, "%d bytes, at most %d", len(b), MaxEventSize)
	}
	if len(b) == 0 || !(msgpcode.IsFixedMap(b[0]) || b[0] == msgpcode.Map16 || b[0] == msgpcode.Map32) {
		return Event{}, badEvent(BadMalformed, "not a msgpack map")
	}
	// msgpack/v5 panics on some malformed input (a nil where a struct
	// belongs: found by FuzzDecode, testdata/fuzz): that is bad input too.
	defer func() {
		if r := recover(); r != nil {
			e, err = Event{}, badEvent(BadMalformed, "%v", r)
		}
	}()
	var version struct {
		V any `msgpack:"v"`
	}
	if err := msgpack.Unmarshal(b, &version); err != nil {
		return Event{}, badEvent(BadMalformed, "%v", err)
	}
	switch v := version.V; {
	case isInt(v, SchemaVersion):
		e, err = decodeV2(b)
	case isInt(v, 1):
		e, err = decodeV1(b)
	default:
		return Event{}, badEvent(BadVersion, "schema version %v, this reader knows 1 and %d", v, SchemaVersion)
	}
	if err != nil {
		return Event{}, err
	}
	if err := e.Validate(); err != nil {
		return Event{}, &DecodeError{Reason: BadInvalid, Err: err}
	}
	return e, nil
}

// isInt reports whether v, as msgpack/v5 decodes an integer into an
// interface, is n.
func isInt(v any, n int64) bool {
	switch v := v.(type) {
	case int8:
		return int64(v) == n
	case int16:
		return int64(v) == n
	case int32:
		return int64(v) == n
	case int64:
		return v == n
	case uint8:
		return int64(v) == n
	case uint16:
		return int64(v) == n
	case uint32:
		return int64(v) == n
	case uint64:
		return n >= 0 && v == uint64(n)
	}
	return false
}

func decodeV2(b []byte) (Event, error) {
	var w wireEvent
	if err := strictUnmarshal(b, &w); err != nil {
		return Event{}, err
	}
	e := Event{Kind: w.Kind, Tenant: string(w.Tenant), Key: cachekey.Key(w.Key), Model: string(w.Model),
		Epoch: w.Epoch, Node: string(w.Node), Cause: w.Cause, Reason: string(w.Reason)}
	if w.Time != 0 {
		e.Time = time.Unix(0, w.Time).UTC()
	}
	if w.Expires != 0 {
		e.Expires = time.Unix(0, w.Expires).UTC()
	}
	if l := w.Location; l != nil {
		e.Location = &payload.Location{Transport: string(l.Transport), Node: string(l.Node), Address: string(l.Address),
			Object: string(l.Object), Size: l.Size, Checksum: payload.Checksum(l.Checksum)}
	}
	return e, nil
}

func decodeV1(b []byte) (Event, error) {
	var v v1Event
	if err := strictUnmarshal(b, &v); err != nil {
		return Event{}, err
	}
	return Event{Kind: v.Kind, Tenant: v.Tenant, Key: v.Key, Model: v.Model, Epoch: v.Epoch, Node: v.Node,
		Time: v.Time, Expires: v.Expires, Location: v.Location, Cause: v.Cause, Reason: v.Reason}, nil
}

// strictUnmarshal decodes one body into v: a key v does not name, or bytes
// after the body, make it bad.
func strictUnmarshal(b []byte, v any) error {
	r := bytes.NewReader(b)
	dec := msgpack.NewDecoder(r)
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(v); errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return badEvent(BadMalformed, "truncated: %v", err)
	} else if err != nil {
		return badEvent(BadInvalid, "%v", err) // a field of another type or size, or an unknown key
	}
	if r.Len() != 0 {
		return badEvent(BadMalformed, "%d bytes after the body", r.Len())
	}
	return nil
}
