package live

import (
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func sample() *Summary {
	return &Summary{V: Version, Node: "gpu-3.example", ID: "0011223344556677", Role: RoleWorker, PID: 42,
		Version: "v1.2", Start: 1_800_000_000_000_000_000, Time: 1_800_000_002_000_000_000, Every: 2000, Seq: 2,
		Requests: map[string]uint64{"local-hit": 10, "computed": 2, "remote-hit": 3},
		Forwards: 2, Pulled: map[string]uint64{"http": 8 << 20}, Written: map[string]uint64{"shm": 16 << 20},
		Held: 24 << 20, Pinned: 8 << 20, Lost: 1, Reconciler: &ReconcilerFigures{Active: true, Elected: 1}}
}

func TestSummaryRoundTrip(t *testing.T) {
	s := sample()
	body, err := Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	subject := Subject(s.Tenant, s.Node, s.ID)
	if subject != "embcache.sum.~.gpu-3_example.0011223344556677" {
		t.Errorf("subject %s", subject)
	}
	got, err := Decode(subject, body)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Errorf("decoded %+v, want %+v", got, s)
	}
	if s.Saved() != 13 || s.Total() != 15 {
		t.Errorf("saved %d of %d, want 13 of 15", s.Saved(), s.Total())
	}
	if len(body) > 300 {
		t.Errorf("a worker's summary is %d bytes, want at most 300 (docs/scaling.md 5)", len(body))
	}
}

// TestBadSummariesAreErrors: what an Aggregator counts as dropped, never a
// panic.
func TestBadSummariesAreErrors(t *testing.T) {
	good := sample()
	body, _ := Encode(good)
	subject := Subject("", good.Node, good.ID)
	v2 := *good
	v2.V = 2
	v2body, _ := Encode(&v2)
	noID := *good
	noID.ID = ""
	noIDbody, _ := Encode(&noID)
	wrongType, _ := msgpack.Marshal(map[string]any{"v": 1, "node": 7})
	for name, c := range map[string]struct {
		subject string
		body    []byte
		want    error
	}{
		"junk":           {subject, []byte("not a summary"), ErrBadSummary},
		"empty":          {subject, nil, ErrBadSummary},
		"truncated":      {subject, body[:len(body)/2], ErrBadSummary},
		"too large":      {subject, make([]byte, MaxSize+1), ErrBadSummary},
		"version 2":      {subject, v2body, ErrVersion},
		"no id":          {subject, noIDbody, ErrBadSummary},
		"wrong type":     {subject, wrongType, ErrBadSummary},
		"other node":     {Subject("", "gpu-4", good.ID), body, ErrBadSummary},
		"other tenant":   {Subject("acme", good.Node, good.ID), body, ErrBadSummary},
		"not a subject":  {"embcache.sum", body, ErrBadSummary},
		"a number":       {subject, []byte{0x07}, ErrBadSummary},
		"a nil":          {subject, []byte{0xc0}, ErrVersion},
		"nested garbage": {subject, []byte{0x81, 0xa1, 'v', 0x81, 0xa1, 'v', 0x01}, ErrBadSummary},
	} {
		if _, err := Decode(c.subject, c.body); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	body, _ := Encode(sample())
	f.Add(body)
	f.Add([]byte("junk"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(Subject("", "gpu-3.example", "0011223344556677"), b)
		if err == nil && (s.Node == "" || s.V != Version) {
			t.Fatalf("accepted %+v", s)
		}
	})
}

func TestSubjectTokens(t *testing.T) {
	if got := Subject("acme", "node a.b*>", "id"); got != "embcache.sum.acme.node_a_b__.id" {
		t.Errorf("got %s", got)
	}
	if !strings.HasPrefix(Subject("", "n", "i"), TenantSubjects("")[:len(Prefix)]) || TenantSubjects("acme") != "embcache.sum.acme.>" {
		t.Error("subjects")
	}
}

// A body whose map declares more entries than it has bytes is a bad
// summary, found before the decoder allocates for the declared length (a
// full decode of these 13 bytes allocates 56 MB);
// so is one that says it is sent more often than MinInterval or less
// often than MaxInterval.
func TestDecodeRefusesWhatWouldCostMemoryOrTime(t *testing.T) {
	huge := []byte{0x82, 0xa1, 'v', 0x01, 0xa3, 'r', 'e', 'q', 0xdf, 0xff, 0xff, 0xff, 0xff}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Decode("embcache.sum.~.n.x", huge)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrBadSummary) {
		t.Fatalf("a map of 2^32-1 entries in 13 bytes: %v, want ErrBadSummary", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("decoding 13 bytes allocated %d bytes", n)
	}
	for _, every := range []int64{1, MaxInterval.Milliseconds() + 1} {
		s := Summary{V: Version, Node: "n", ID: "x", Role: "worker", Start: 1, Time: 1, Every: every}
		body, err := msgpack.Marshal(&s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(Subject("", "n", "x"), body); !errors.Is(err, ErrBadSummary) {
			t.Fatalf("every %d ms: %v, want ErrBadSummary", every, err)
		}
	}
}
