package lease

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/payload"
)

func validCommitted() Record {
	loc := payload.Location{Transport: "shm", Node: "n", Address: "/dev/shm/embcache",
		Object: object(1).String(), Size: 4160, Checksum: payload.Checksum{9}}
	now := time.Unix(1_800_000_000, 0).UTC()
	r := Record{V: RecordVersion, State: StateComputing, Owner: "n/1/ab", Nonce: "cd", Started: now, Heartbeat: now}
	return r.Committed(loc, value(), now, time.Hour)
}

func TestDecodeRecordRefusesBadRecords(t *testing.T) {
	good := validCommitted()
	if _, err := DecodeRecord(kvKey(1), good.mustEncode()); err != nil {
		t.Fatalf("a valid record: %v", err)
	}
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		json.Unmarshal(good.mustEncode(), &m)
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	for name, b := range map[string][]byte{
		"empty":              nil,
		"not json":           []byte("committed"),
		"truncated":          good.mustEncode()[:40],
		"array":              []byte("[1,2]"),
		"unknown version":    edit(func(m map[string]any) { m["v"] = 2 }),
		"no version":         edit(func(m map[string]any) { delete(m, "v") }),
		"unknown state":      edit(func(m map[string]any) { m["state"] = "done" }),
		"no state":           edit(func(m map[string]any) { delete(m, "state") }),
		"no owner":           edit(func(m map[string]any) { m["owner"] = "" }),
		"no location":        edit(func(m map[string]any) { delete(m, "location") }),
		"computing+location": edit(func(m map[string]any) { m["state"] = "computing" }),
		"size disagrees":     edit(func(m map[string]any) { m["size"] = 1 }),
		"checksum disagrees": edit(func(m map[string]any) { m["checksum"] = "00" }),
		"traversal object": edit(func(m map[string]any) {
			m["location"].(map[string]any)["object"] = "../../etc/passwd"
		}),
		"bad transport": edit(func(m map[string]any) { m["location"].(map[string]any)["transport"] = "ftp" }),
		"wrong types":   edit(func(m map[string]any) { m["size"] = "big" }),
	} {
		if _, err := DecodeRecord(kvKey(1), b); !errors.Is(err, ErrBadRecord) {
			t.Errorf("%s: %v, want ErrBadRecord", name, err)
		}
	}
}

// A record decodes only under a key of its kind: a tombstone's key holds
// invalidated records alone, every other key computing and committed
// ones. Anything else is a bad record (invalid), as one that does not
// parse: a tombstone at a value's key was waited on as a compute until
// its TTL.
func TestDecodeRecordByItsKey(t *testing.T) {
	committed := validCommitted()
	computing := committed
	computing.State, computing.Location, computing.Size, computing.Checksum = StateComputing, nil, 0, ""
	now := time.Unix(1_800_000_000, 0).UTC()
	tomb := Record{V: RecordVersion, State: StateInvalidated, Owner: "cli", Started: now, Heartbeat: now, Model: "m", Epoch: 1}
	tombKey := TombstoneKey("acme", "m", 1)
	for _, c := range []struct {
		key string
		rec Record
		ok  bool
	}{
		{kvKey(1), computing, true},
		{kvKey(1), committed, true},
		{kvKey(1), tomb, false},
		{tombKey, tomb, true},
		{tombKey, computing, false},
		{tombKey, committed, false},
		{"_reconciler", computing, true},
		{"_reconciler", tomb, false},
	} {
		r, err := DecodeRecord(c.key, c.rec.mustEncode())
		switch {
		case c.ok && (err != nil || r.State != c.rec.State):
			t.Errorf("%v under %s: %v", c.rec.State, c.key, err)
		case !c.ok && (!errors.Is(err, ErrBadRecord) || BadReason(err) != events.BadInvalid):
			t.Errorf("%v under %s: %v, want ErrBadRecord (invalid)", c.rec.State, c.key, err)
		}
	}
}

// FuzzDecodeRecord: any bytes under any key decode to a record that
// satisfies the protocol's rules there or fail with ErrBadRecord; never a
// panic.
func FuzzDecodeRecord(f *testing.F) {
	good := validCommitted()
	f.Add(kvKey(1), good.mustEncode())
	computing := good
	computing.State, computing.Location = StateComputing, nil
	f.Add(kvKey(1), computing.mustEncode())
	f.Add(kvKey(1), []byte(`{"v":1,"state":"committed","owner":"x","location":{"transport":"shm","object":"a/b","size":64}}`))
	f.Add("acme.inv.00", []byte(`{"v":1,"state":"invalidated","owner":"x","model":"m"}`))
	f.Add("", []byte(`{}`))
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		r, err := DecodeRecord(key, b)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("%v is not ErrBadRecord", err)
			}
			return
		}
		if r.State == StateCommitted && (r.Location == nil || r.Location.Validate() != nil) {
			t.Fatal("a committed record without a valid location decoded")
		}
		if (r.State == StateInvalidated) != IsTombstoneKey(key) {
			t.Fatalf("a %v record decoded under %q", r.State, key)
		}
	})
}

func (r Record) mustEncode() []byte {
	b, err := r.encode()
	if err != nil {
		panic(err)
	}
	return b
}

// A record without a state is refused before it is written.
func TestUnmarshalableRecordIsBadRecord(t *testing.T) {
	if _, err := (Record{V: RecordVersion, Owner: "o"}).encode(); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("got %v", err)
	}
}
