package events

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
	"github.com/vmihailenco/msgpack/v5"
)

var update = flag.Bool("update", false, "rewrite testdata/events/*.msgpack from the .json vectors")

// vector is a golden event in testdata/events: NAME.json holds the subject
// and the body's fields as docs/protocol.md section 4 names them (bin
// fields as hex), NAME.msgpack the body itself.
type vector struct {
	Subject string     `json:"subject"`
	Event   wireFields `json:"event"`
}

type wireFields struct {
	V        int            `json:"v"`
	Kind     Kind           `json:"kind"`
	Tenant   string         `json:"tenant"`
	Key      string         `json:"key"`
	Model    string         `json:"model,omitempty"`
	Epoch    uint64         `json:"epoch,omitempty"`
	Node     string         `json:"node,omitempty"`
	Time     int64          `json:"time"`
	Expires  int64          `json:"expires,omitempty"`
	Location *wireLocFields `json:"location,omitempty"`
	Cause    Cause          `json:"cause,omitempty"`
	Reason   string         `json:"reason,omitempty"`
}

type wireLocFields struct {
	Transport string `json:"transport"`
	Node      string `json:"node"`
	Address   string `json:"address,omitempty"`
	Object    string `json:"object"`
	Size      int64  `json:"size"`
	Checksum  string `json:"checksum"`
}

func (w wireFields) event(t *testing.T) *Event {
	t.Helper()
	k, err := cachekey.Parse(w.Key)
	if err != nil {
		t.Fatal(err)
	}
	e := &Event{Kind: w.Kind, Tenant: w.Tenant, Key: k, Model: w.Model, Epoch: w.Epoch, Node: w.Node,
		Time: time.Unix(0, w.Time).UTC(), Cause: w.Cause, Reason: w.Reason}
	if w.Expires != 0 {
		e.Expires = time.Unix(0, w.Expires).UTC()
	}
	if l := w.Location; l != nil {
		sum, err := hex.DecodeString(l.Checksum)
		if err != nil || len(sum) != 32 {
			t.Fatalf("checksum %q: %v", l.Checksum, err)
		}
		loc := payload.Location{Transport: l.Transport, Node: l.Node, Address: l.Address, Object: l.Object, Size: l.Size}
		copy(loc.Checksum[:], sum)
		e.Location = &loc
	}
	return e
}

func vectors(t *testing.T) map[string]vector {
	t.Helper()
	files, err := filepath.Glob("testdata/events/*.json")
	if err != nil || len(files) < 5 {
		t.Fatalf("golden vectors: %v (%d files)", err, len(files))
	}
	out := map[string]vector{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var v vector
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".json")] = v
	}
	return out
}

// The golden vectors are what Encode writes, byte for byte; Decode reads
// them back to the same event, which re-encodes to the same bytes.
func TestGoldenEvents(t *testing.T) {
	for name, v := range vectors(t) {
		want := v.Event.event(t)
		file := filepath.Join("testdata/events", name+".msgpack")
		b, err := Encode(want)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if *update {
			if err := os.WriteFile(file, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		golden, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, golden) {
			t.Errorf("%s: Encode wrote\n%x\nthe vector is\n%x", name, b, golden)
		}
		got, err := Decode(golden)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(&got, want) {
			t.Errorf("%s: decoded %+v, want %+v", name, got, want)
		}
		if again, _ := Encode(&got); !bytes.Equal(again, golden) {
			t.Errorf("%s: decode and re-encode changed the bytes", name)
		}
		if got.Subject() != v.Subject {
			t.Errorf("%s: subject %s, the vector says %s", name, got.Subject(), v.Subject)
		}
	}
}

// Version 1 bodies, as streams written before version 2 hold them, decode
// to the same events as their version 2 vectors.
func TestVersion1EventsStillDecode(t *testing.T) {
	all := vectors(t)
	files, _ := filepath.Glob("testdata/events/v1-*.msgpack")
	if len(files) < 3 {
		t.Fatalf("%d version 1 vectors", len(files))
	}
	for _, f := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "v1-"), ".msgpack")
		v, ok := all[name]
		if !ok {
			t.Fatalf("%s has no version 2 vector %s.json", f, name)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		want := v.Event.event(t)
		if !got.Time.Equal(want.Time) || !got.Expires.Equal(want.Expires) {
			t.Errorf("%s: times %v %v, want %v %v", f, got.Time, got.Expires, want.Time, want.Expires)
		}
		got.Time, got.Expires = want.Time, want.Expires
		if !reflect.DeepEqual(&got, want) {
			t.Errorf("%s: decoded %+v, want %+v", f, got, want)
		}
	}
}

// Fields of the wrong type or size are bad events, not zero values.
func TestDecodeRefusesWrongTypes(t *testing.T) {
	golden, err := os.ReadFile("testdata/events/published.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func([]byte) []byte{
		"short key": func(b []byte) []byte {
			return bytes.Replace(b, []byte("\xa3key\xc4\x20"), []byte("\xa3key\xc4\x1f"), 1)[:len(b)-1]
		},
		"kind as a string": func(b []byte) []byte { return bytes.Replace(b, []byte("\xa4kind\x01"), []byte("\xa4kind\xa11"), 1) },
		"version 3":        func(b []byte) []byte { return bytes.Replace(b, []byte("\xa1v\x02"), []byte("\xa1v\x03"), 1) },
		"a negative epoch": func(b []byte) []byte { return bytes.Replace(b, []byte("\xa5epoch\x03"), []byte("\xa5epoch\xff"), 1) },
		"a nil epoch":      func(b []byte) []byte { return bytes.Replace(b, []byte("\xa5epoch\x03"), []byte("\xa5epoch\xc0"), 1) },
		"kind 261": func(b []byte) []byte {
			return bytes.Replace(b, []byte("\xa4kind\x01"), []byte("\xa4kind\xcd\x01\x05"), 1)
		},
		"a float time": func(b []byte) []byte { return bytes.Replace(b, []byte("\xa4time\xcf"), []byte("\xa4time\xcb"), 1) },
		"truncated":    func(b []byte) []byte { return b[:len(b)-3] },
	} {
		b := edit(bytes.Clone(golden))
		if bytes.Equal(b, golden) {
			t.Fatalf("%s: the edit did not apply", name)
		}
		if e, err := Decode(b); err == nil {
			t.Errorf("%s: decoded %+v", name, e)
		}
	}
}

func TestDecodeRefusesUnknownKeysAndTrailingBytes(t *testing.T) {
	golden, err := os.ReadFile("testdata/events/evicted.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	extra := bytes.Clone(golden)
	extra[0]++ // one more key in the map
	extra = append(extra, "\xa5extra\x01"...)
	for name, b := range map[string][]byte{
		"unknown key":    extra,
		"trailing bytes": append(bytes.Clone(golden), 0xc0),
		"bin as str":     bytes.Replace(golden, []byte("\xa4node\xaareconciler"), []byte("\xa4node\xc4\x0areconciler"), 1),
	} {
		if bytes.Equal(b, golden) {
			t.Fatalf("%s: the edit did not apply", name)
		}
		if e, err := Decode(b); !errors.Is(err, ErrBadEvent) {
			t.Errorf("%s: %+v, %v", name, e, err)
		}
	}
}

// A version 1 body's integers out of their field's range are bad events:
// a kind of 261 or -251 wrapped round to invalidated, an epoch of -1 to
// 2^64-1.
func TestVersion1OutOfRangeIntegersAreBad(t *testing.T) {
	golden, err := os.ReadFile("testdata/events/v1-invalidated.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(golden); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field string
		value any
	}{{"kind", 261}, {"kind", -251}, {"epoch", -1}, {"cause", 259}} {
		var m map[string]any
		if err := msgpack.Unmarshal(golden, &m); err != nil {
			t.Fatal(err)
		}
		m[tc.field] = tc.value
		b, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if e, err := Decode(b); !errors.Is(err, ErrBadEvent) {
			t.Errorf("%s %v: decoded %+v, %v; want ErrBadEvent", tc.field, tc.value, e, err)
		}
	}
}
