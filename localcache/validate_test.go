package localcache

import (
	"context"
	"errors"
	"math"
	"testing"
)

// TestNilValueIsAnError: Put of a nil value is ErrInvalidValue, not a
// panic in Size.
func TestNilValueIsAnError(t *testing.T) {
	c, err := New(Options[string, *tensor]{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put("r", "k", nil); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("Put(nil): %v", err)
	}
	ci, err := New(Options[string, Value]{}) // a V that is an interface
	if err != nil {
		t.Fatal(err)
	}
	if err := ci.Put("", "k", nil); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("Put(nil interface): %v", err)
	}
	// A nil slice is an empty value, not a missing one.
	cb, _, _ := newTestCache(t)
	if err := cb.Put("", "k", blob(nil)); err != nil || !cb.Contains("k") {
		t.Fatalf("Put(nil slice): %v", err)
	}
}

// TestNilComputeIsAnError: a compute that returns a nil value is
// ErrInvalidValue for its waiters; the key can be computed again. (Size
// ran in the compute's goroutine, outside any recover: the process died.)
func TestNilComputeIsAnError(t *testing.T) {
	c, err := New(Options[string, *tensor]{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.GetOrCompute(t.Context(), "r", "k", func(context.Context) (*tensor, error) { return nil, nil })
	if !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("compute of nil: %v", err)
	}
	if s := c.Stats(); s.Entries != 0 || s.Bytes != 0 || s.Pinned != 0 || s.Requests != 0 || s.InFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
	// The key can be computed after.
	v, err := c.GetOrCompute(t.Context(), "r", "k", func(context.Context) (*tensor, error) { return &tensor{make([]float32, 2)}, nil })
	if err != nil || v.Size() != 8 {
		t.Fatalf("after: %v %v", v, err)
	}
	c.Release("r")

	ci, err := New(Options[string, Value]{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ci.GetOrCompute(t.Context(), "r", "k", func(context.Context) (Value, error) { return nil, nil }); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("compute of nil interface: %v", err)
	}
}

// TestSizePanicIsAnError: a Size that panics is ErrInvalidValue.
func TestSizePanicIsAnError(t *testing.T) {
	c, err := New(Options[string, *bomb]{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put("", "k", &bomb{}); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("Put: %v", err)
	}
	if _, err := c.GetOrCompute(t.Context(), "r", "k", func(context.Context) (*bomb, error) { return &bomb{}, nil }); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("compute: %v", err)
	}
	if s := c.Stats(); s.Entries != 0 || s.InFlight != 0 || s.Requests != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestNegativeSizeIsInvalid: a negative size is ErrInvalidValue, not
// ErrTooLarge (it is not larger than anything).
func TestNegativeSizeIsInvalid(t *testing.T) {
	c, err := New(Options[string, liar]{Budget: Budget{MaxBytes: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put("r", "k", liar(-5)); !errors.Is(err, ErrInvalidValue) || errors.Is(err, ErrTooLarge) {
		t.Fatalf("Put: %v", err)
	}
	if _, err := c.GetOrCompute(t.Context(), "r", "k", func(context.Context) (liar, error) { return -5, nil }); !errors.Is(err, ErrInvalidValue) || errors.Is(err, ErrTooLarge) {
		t.Fatalf("compute: %v", err)
	}
	if s := c.Stats(); s.Entries != 0 || s.Bytes != 0 || s.Pinned != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestHugeValuesDoNotOverflow: with a budget of math.MaxInt64, values
// whose sizes add up past it evict the unpinned ones before them, or are
// ErrTooLarge beside pinned ones; the byte count never wraps (it did, to a
// negative count under which nothing was evicted).
func TestHugeValuesDoNotOverflow(t *testing.T) {
	c, err := New(Options[string, liar]{Budget: Budget{MaxBytes: math.MaxInt64}})
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{"a", "b", "c"} {
		size := int64(math.MaxInt64 - i)
		if err := c.Put("", k, liar(size)); err != nil {
			t.Fatalf("Put %s: %v", k, err)
		}
		if s := c.Stats(); s.Bytes != size || s.Entries != 1 || !c.Contains(k) || s.Evicted(CauseSize) != uint64(i) {
			t.Fatalf("after %s: %+v", k, s)
		}
	}
	if v, err := c.GetOrCompute(t.Context(), "r", "d", func(context.Context) (liar, error) { return 5, nil }); err != nil || v != 5 {
		t.Fatalf("compute beside an unpinned huge value: %v %v", v, err)
	}
	if s := c.Stats(); s.Bytes != 5 || s.Entries != 1 {
		t.Fatalf("after the compute: %+v", s)
	}
	// Pinned, so nothing can be evicted to make room.
	c2, _ := New(Options[string, liar]{Budget: Budget{MaxBytes: math.MaxInt64}})
	if err := c2.Put("r", "a", liar(math.MaxInt64)); err != nil {
		t.Fatal(err)
	}
	if err := c2.Put("r", "b", 1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a value the byte count cannot hold: %v", err)
	}
	if _, err := c2.GetOrCompute(t.Context(), "r", "c", func(context.Context) (liar, error) { return 1, nil }); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a computed value the byte count cannot hold: %v", err)
	}
	if s := c2.Stats(); s.Bytes != math.MaxInt64 || s.Entries != 1 || s.InFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
	c2.Release("r")
	if err := c2.Put("", "b", 1); err != nil {
		t.Fatal(err)
	}
	if s := c2.Stats(); s.Bytes != 1 || s.Entries != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestATooLargeComputeGoesToOnEvict: a computed value over the budget is
// an error for its callers and is never held, so OnEvict is where its
// resources are released (the coordinator closes a value's mapping there:
// it was left open).
func TestATooLargeComputeGoesToOnEvict(t *testing.T) {
	c, _, log := newTestCache(t, Options[string, blob]{Budget: Budget{MaxBytes: 100}})
	_, err := c.GetOrCompute(context.Background(), "r", "big", func(context.Context) (blob, error) {
		return make(blob, 101), nil
	})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("GetOrCompute of a value over the budget: %v", err)
	}
	if log.cause("big") != CauseSize {
		t.Fatalf("the refused value went to OnEvict with %v, want size", log.cause("big"))
	}
	if s := c.Stats(); s.Bytes != 0 || s.Entries != 0 || s.Pinned != 0 {
		t.Fatalf("accounting: %+v", s)
	}
}

// tensor is a value behind a pointer, as the coordinator's *payload.Value
// is: its Size reads through the pointer.
type tensor struct{ data []float32 }

func (t *tensor) Size() int64 { return int64(4 * len(t.data)) }

// bomb is a value whose Size panics.
type bomb struct{}

func (*bomb) Size() int64 { panic("no size") }

// liar is a value that claims the size it is given.
type liar int64

func (l liar) Size() int64 { return int64(l) }
