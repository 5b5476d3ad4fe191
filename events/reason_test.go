package events

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
)

// TestReasonOf: each body Decode refuses gets the reason metrics count it
// by.
func TestReasonOf(t *testing.T) {
	good, err := Encode(&Event{Kind: KindEvicted, Tenant: "acme", Key: cachekey.Key{1}, Cause: CauseExpired, Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		body []byte
		want BadReason
	}{
		{"too large", make([]byte, MaxEventSize+1), BadTooLarge},
		{"text", []byte("not an event"), BadMalformed},
		{"never valid msgpack", []byte{0xc1}, BadMalformed},
		{"empty", nil, BadMalformed},
		{"truncated", good[:len(good)/2], BadMalformed},
		{"a future version", []byte{0x81, 0xa1, 'v', 99}, BadVersion},
		{"no version", []byte{0x81, 0xa4, 'k', 'i', 'n', 'd', 0x03}, BadVersion},
		{"a string version", []byte{0x81, 0xa1, 'v', 0xa1, '2'}, BadVersion},
		{"version 1, nothing else", []byte{0x81, 0xa1, 'v', 0x01}, BadInvalid},
		{"this version, nothing else", []byte{0x81, 0xa1, 'v', SchemaVersion}, BadInvalid},
		{"an array", []byte{0x92, 0x02, 0x03}, BadMalformed},
		{"a key of 31 bytes", bytes.Replace(good, []byte("\xa3key\xc4\x20\x01"), []byte("\xa3key\xc4\x1f"), 1), BadInvalid},
		{"trailing bytes", append(bytes.Clone(good), 0xc0), BadMalformed},
	} {
		_, err := Decode(c.body)
		if !errors.Is(err, ErrBadEvent) {
			t.Fatalf("%s: Decode accepted it (%v)", c.name, err)
		}
		if got := ReasonOf(err); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	for _, r := range BadReasons() {
		if r.String() == "" || r.String()[0] == 'B' {
			t.Errorf("reason %d has no name: %q", r, r)
		}
	}
}
