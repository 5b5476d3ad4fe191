package events

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
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
	V        uintField     `msgpack:"v"`
	Kind     uintField     `msgpack:"kind"`
	Tenant   str           `msgpack:"tenant"`
	Key      bin32         `msgpack:"key"`
	Model    str           `msgpack:"model,omitempty"`
	Epoch    uintField     `msgpack:"epoch,omitempty"`
	Node     str           `msgpack:"node,omitempty"`
	Time     intField      `msgpack:"time"`
	Expires  intField      `msgpack:"expires,omitempty"`
	Location *wireLocation `msgpack:"location,omitempty"`
	Cause    uintField     `msgpack:"cause,omitempty"`
	Reason   str           `msgpack:"reason,omitempty"`
}

type wireLocation struct {
	Transport str       `msgpack:"transport"`
	Node      str       `msgpack:"node"`
	Address   str       `msgpack:"address,omitempty"`
	Object    str       `msgpack:"object"`
	Size      uintField `msgpack:"size"`
	Checksum  bin32     `msgpack:"checksum"`
}

// str, bin32, uintField and intField are the body's str, 32-byte bin,
// uint and int fields: msgpack/v5 would read a str as a bin and the other
// way round, nil as empty or 0, a float or a negative int as a uint, which
// the protocol does not allow.
type (
	str       string
	bin32     [32]byte
	uintField uint64
	intField  int64
)

func (u uintField) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.EncodeUint(uint64(u)) }

func (u *uintField) DecodeMsgpack(dec *msgpack.Decoder) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case msgpcode.IsFixedNum(c) && c <= msgpcode.PosFixedNumHigh,
		c == msgpcode.Uint8, c == msgpcode.Uint16, c == msgpcode.Uint32, c == msgpcode.Uint64:
		n, err := dec.DecodeUint64()
		*u = uintField(n)
		return err
	case c == msgpcode.Int8, c == msgpcode.Int16, c == msgpcode.Int32, c == msgpcode.Int64:
		n, err := dec.DecodeInt64()
		if err == nil && n < 0 {
			err = fmt.Errorf("%d where a uint belongs", n)
		}
		*u = uintField(n)
		return err
	}
	return fmt.Errorf("msgpack code %#x where a uint belongs", c)
}

func (i intField) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.EncodeInt(int64(i)) }

func (i *intField) DecodeMsgpack(dec *msgpack.Decoder) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case msgpcode.IsFixedNum(c), c == msgpcode.Int8, c == msgpcode.Int16, c == msgpcode.Int32, c == msgpcode.Int64,
		c == msgpcode.Uint8, c == msgpcode.Uint16, c == msgpcode.Uint32:
		n, err := dec.DecodeInt64()
		*i = intField(n)
		return err
	case c == msgpcode.Uint64:
		n, err := dec.DecodeUint64()
		if err == nil && n > math.MaxInt64 {
			err = fmt.Errorf("%d does not fit an int", n)
		}
		*i = intField(n)
		return err
	}
	return fmt.Errorf("msgpack code %#x where an int belongs", c)
}

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
	Kind     uintField         `msgpack:"kind"` // uintField: a Kind or uint64 wraps 261 and -1 round
	Tenant   string            `msgpack:"tenant"`
	Key      cachekey.Key      `msgpack:"key"`
	Model    string            `msgpack:"model"`
	Epoch    uintField         `msgpack:"epoch"`
	Node     string            `msgpack:"node"`
	Time     time.Time         `msgpack:"time"`
	Expires  time.Time         `msgpack:"expires"`
	Location *payload.Location `msgpack:"location"`
	Cause    uintField         `msgpack:"cause"`
	Reason   string            `msgpack:"reason"`
}

// Encode validates e and returns its body (version SchemaVersion).
func Encode(e *Event) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	w := wireEvent{V: SchemaVersion, Kind: uintField(e.Kind), Tenant: str(e.Tenant), Key: bin32(e.Key), Model: str(e.Model),
		Epoch: uintField(e.Epoch), Node: str(e.Node), Time: intField(e.Time.UnixNano()), Cause: uintField(e.Cause), Reason: str(e.Reason)}
	if !e.Expires.IsZero() {
		w.Expires = intField(e.Expires.UnixNano())
	}
	if l := e.Location; l != nil {
		w.Location = &wireLocation{Transport: str(l.Transport), Node: str(l.Node), Address: str(l.Address),
			Object: str(l.Object), Size: uintField(l.Size), Checksum: bin32(l.Checksum)}
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
	// The body's keys, once: its version, and (version 2) no nil value.
	var fields map[string]msgpack.RawMessage
	if err := msgpack.Unmarshal(b, &fields); err != nil {
		return Event{}, badEvent(BadMalformed, "%v", err)
	}
	var v any
	if raw := fields["v"]; len(raw) > 0 {
		if err := msgpack.Unmarshal(raw, &v); err != nil {
			return Event{}, badEvent(BadMalformed, "%v", err)
		}
	}
	switch {
	case isInt(v, SchemaVersion):
		e, err = decodeV2(b, fields)
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

func decodeV2(b []byte, fields map[string]msgpack.RawMessage) (Event, error) {
	if err := refuseNils(fields, "location"); err != nil {
		return Event{}, err
	}
	var w wireEvent
	if err := strictUnmarshal(b, &w); err != nil {
		return Event{}, err
	}
	if w.Kind > math.MaxUint8 || w.Cause > math.MaxUint8 {
		return Event{}, badEvent(BadInvalid, "kind %d or cause %d out of range", w.Kind, w.Cause)
	}
	e := Event{Kind: Kind(w.Kind), Tenant: string(w.Tenant), Key: cachekey.Key(w.Key), Model: string(w.Model),
		Epoch: uint64(w.Epoch), Node: string(w.Node), Cause: Cause(w.Cause), Reason: string(w.Reason)}
	if w.Time != 0 {
		e.Time = time.Unix(0, int64(w.Time)).UTC()
	}
	if w.Expires != 0 {
		e.Expires = time.Unix(0, int64(w.Expires)).UTC()
	}
	if l := w.Location; l != nil {
		if l.Size > math.MaxInt64 {
			return Event{}, badEvent(BadInvalid, "location size %d out of range", l.Size)
		}
		e.Location = &payload.Location{Transport: string(l.Transport), Node: string(l.Node), Address: string(l.Address),
			Object: string(l.Object), Size: int64(l.Size), Checksum: payload.Checksum(l.Checksum)}
	}
	return e, nil
}

func decodeV1(b []byte) (Event, error) {
	var v v1Event
	if err := strictUnmarshal(b, &v); err != nil {
		return Event{}, err
	}
	if v.Kind > math.MaxUint8 || v.Cause > math.MaxUint8 {
		return Event{}, badEvent(BadInvalid, "kind %d or cause %d out of range", v.Kind, v.Cause)
	}
	return Event{Kind: Kind(v.Kind), Tenant: v.Tenant, Key: v.Key, Model: v.Model, Epoch: uint64(v.Epoch), Node: v.Node,
		Time: v.Time, Expires: v.Expires, Location: v.Location, Cause: Cause(v.Cause), Reason: v.Reason}, nil
}

// refuseNils refuses a nil value among fields, or in the map under key
// nested: msgpack/v5 reads nil as any field's zero value without asking the
// field's decoder.
func refuseNils(fields map[string]msgpack.RawMessage, nested string) error {
	for k, v := range fields {
		if len(v) == 0 || (len(v) == 1 && v[0] == msgpcode.Nil) {
			return badEvent(BadInvalid, "%s is nil", k)
		}
		if k == nested {
			var inner map[string]msgpack.RawMessage
			if err := msgpack.Unmarshal(v, &inner); err != nil {
				return badEvent(BadMalformed, "%v", err)
			}
			if err := refuseNils(inner, ""); err != nil {
				return err
			}
		}
	}
	return nil
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
