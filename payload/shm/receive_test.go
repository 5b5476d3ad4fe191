package shm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/embcache/embcache/payload"
	"github.com/zeebo/blake3"
)

// TestReceive: a streamed encoding lands as the file Put would have
// written, and reads back as the value.
func TestReceive(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t), WithNode("node-b"))
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(300_000) // several chunks, the last one short
	enc, _ := payload.Encode(v)
	sum, _ := payload.Sum(v)
	loc, err := s.Receive(ctx, obj(1), int64(len(enc)), sum, bytes.NewReader(enc))
	if err != nil {
		t.Fatal(err)
	}
	if loc.Transport != payload.TransportShm || loc.Node != "node-b" || loc.Size != int64(len(enc)) || loc.Checksum != sum {
		t.Fatalf("location %+v", loc)
	}
	got, err := s.Get(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
		t.Fatal("value differs")
	}
	// Bit-identical to what Put writes: the same file, trailer included.
	other, _ := Open(testDir(t))
	if _, err := other.Put(ctx, obj(1), v); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(s.Path(obj(1)))
	b, _ := os.ReadFile(other.Path(obj(1)))
	if !bytes.Equal(a, b) {
		t.Fatal("a received file differs from a put one")
	}
	if fi, _ := os.Stat(s.Path(obj(1))); fi.Mode().Perm()&0o222 != 0 || s.Used() != fi.Size() {
		t.Fatalf("mode %v, used %d of %d", fi.Mode(), s.Used(), fi.Size())
	}
	// Present already: the reader is not touched.
	again, err := s.Receive(ctx, obj(1), int64(len(enc)), sum, failingReader{t})
	if err != nil || again != loc {
		t.Fatalf("second receive: %+v %v", again, err)
	}
}

type failingReader struct{ t *testing.T }

func (r failingReader) Read([]byte) (int, error) {
	r.t.Error("read a value that is present already")
	return 0, io.ErrUnexpectedEOF
}

// TestReceiveRefusesWhatIsNotTheValue: bytes that do not hash to the
// checksum, too few bytes, or bytes that hash right but do not decode are
// payload.ErrCorrupt, and leave no file, temp file or used byte behind.
func TestReceiveRefusesWhatIsNotTheValue(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t))
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(100_000)
	enc, _ := payload.Encode(v)
	sum, _ := payload.Sum(v)
	flipped := bytes.Clone(enc)
	flipped[len(flipped)-1] ^= 1
	notCanonical := bytes.Clone(enc)
	notCanonical[60] = 1 // a reserved byte
	for name, tc := range map[string]struct {
		body []byte
		sum  payload.Checksum
	}{
		"flipped byte":  {flipped, sum},
		"short":         {enc[:len(enc)-1000], sum},
		"other sum":     {enc, payload.Checksum{1}},
		"not canonical": {notCanonical, payload.Checksum(blake3.Sum256(notCanonical))},
	} {
		loc, err := s.Receive(ctx, obj(2), int64(len(enc)), tc.sum, bytes.NewReader(tc.body))
		if !errors.Is(err, payload.ErrCorrupt) || loc != (payload.Location{}) {
			t.Errorf("%s: %+v %v, want ErrCorrupt", name, loc, err)
		}
		if _, err := os.Stat(s.Path(obj(2))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: a refused value left a file", name)
		}
		if tmps, _ := os.ReadDir(filepath.Join(s.Dir(), tmpDir)); len(tmps) != 0 || s.Used() != 0 {
			t.Errorf("%s: %d temp files left, %d bytes used", name, len(tmps), s.Used())
		}
	}
	if _, err := s.Receive(ctx, obj(2), 10, sum, bytes.NewReader(enc)); !errors.Is(err, payload.ErrCorrupt) {
		t.Errorf("a size below a prelude: %v", err)
	}
}

// TestReceiveBudget: over the budget is ErrNoSpace before a byte is read.
func TestReceiveBudget(t *testing.T) {
	s, err := Open(testDir(t), WithMaxBytes(10_000))
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(5000)
	enc, _ := payload.Encode(v)
	sum, _ := payload.Sum(v)
	if _, err := s.Receive(context.Background(), obj(3), int64(len(enc)), sum, failingReader{t}); !errors.Is(err, payload.ErrNoSpace) {
		t.Fatalf("over budget: %v", err)
	}
	if tmps, _ := os.ReadDir(filepath.Join(s.Dir(), tmpDir)); len(tmps) != 0 || s.Used() != 0 {
		t.Fatalf("%d temp files left, %d bytes used", len(tmps), s.Used())
	}
}

// TestReceiveCanceled: a reader that fails because the context ended gives
// the context's error, not ErrCorrupt.
func TestReceiveCanceled(t *testing.T) {
	s, err := Open(testDir(t))
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(100_000)
	enc, _ := payload.Encode(v)
	sum, _ := payload.Sum(v)
	ctx, cancel := context.WithCancel(context.Background())
	r := io.MultiReader(bytes.NewReader(enc[:1000]), readerFunc(func([]byte) (int, error) {
		cancel()
		return 0, context.Canceled
	}))
	if _, err := s.Receive(ctx, obj(4), int64(len(enc)), sum, r); !errors.Is(err, context.Canceled) || errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("canceled: %v", err)
	}
	if tmps, _ := os.ReadDir(filepath.Join(s.Dir(), tmpDir)); len(tmps) != 0 || s.Used() != 0 {
		t.Fatalf("%d temp files left, %d bytes used", len(tmps), s.Used())
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
