package httppull

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/embcache/embcache/payload"
)

// TestStream: the body is the encoding, unverified, once the headers agree
// with the location; the errors are Get's.
func TestStream(t *testing.T) {
	ctx := context.Background()
	a, b := newNode(t, "a", false, "tok"), newNode(t, "b", false, "tok")
	b.trusting(t, a)
	v := value(3 << 20)
	loc, err := a.transport.Put(ctx, testObj, v)
	if err != nil {
		t.Fatal(err)
	}
	body, err := b.transport.Stream(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(body)
	body.Close()
	enc, _ := payload.Encode(v)
	if err != nil || !bytes.Equal(got, enc) {
		t.Fatalf("streamed %d bytes, want the %d of the encoding: %v", len(got), len(enc), err)
	}
	other := loc
	other.Checksum[0] ^= 1
	if _, err := b.transport.Stream(ctx, other); !errors.Is(err, payload.ErrCorrupt) {
		t.Errorf("a location with another checksum: %v", err)
	}
	seen, _ := a.transport.Generation(ctx, loc)
	a.transport.Delete(ctx, loc, seen)
	if _, err := b.transport.Stream(ctx, loc); !errors.Is(err, payload.ErrNotFound) {
		t.Errorf("deleted: %v", err)
	}
}
