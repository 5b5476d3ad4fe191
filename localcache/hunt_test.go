package localcache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/fakeclock"
	"pgregory.net/rapid"
)

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

// TestEvictUnknownCause: an Evict or Invalidate with a cause outside the
// named ones (the zero Cause, a Cause(200)) neither panics nor loses the
// byte and pin accounting: the entries go as CauseExplicit, a pinned one on
// its release. (The zero Cause marked a pinned entry as still indexed, so
// its bytes were never given back and the pinned count went negative.)
func TestEvictUnknownCause(t *testing.T) {
	for _, cause := range []Cause{0, 200} {
		t.Run(cause.String(), func(t *testing.T) {
			c, _, log := newTestCache(t, Options[string, blob]{Budget: Budget{MaxBytes: 100}})
			mustPut(t, c, "r", "pinned", make(blob, 10))
			mustPut(t, c, "", "free", make(blob, 10))
			if !c.Evict("pinned", cause) || !c.Evict("free", cause) {
				t.Fatal("Evict found nothing")
			}
			if c.Contains("pinned") || c.Contains("free") {
				t.Fatal("an evicted entry is still in the index")
			}
			if log.cause("pinned") != 0 {
				t.Fatal("the pinned entry was dropped under its holder")
			}
			c.Release("r")
			if s := c.Stats(); s.Bytes != 0 || s.Entries != 0 || s.Pinned != 0 {
				t.Fatalf("accounting drifted: %+v", s)
			}
			if log.cause("free") != CauseExplicit || log.cause("pinned") != CauseExplicit {
				t.Fatalf("reported as %v and %v, want explicit", log.cause("free"), log.cause("pinned"))
			}
			// The pinned counter is right: the budget is still enforced.
			for _, k := range []string{"a", "b", "c"} {
				mustPut(t, c, "", k, make(blob, 40))
			}
			if s := c.Stats(); s.Bytes != 80 || s.Entries != 2 {
				t.Fatalf("budget not enforced after the evictions: %+v", s)
			}
		})
	}
}

// TestInvalidateUnknownCauseDiscardsCompute: an Invalidate with the zero
// Cause still keeps a compute that it overtook out of the index.
func TestInvalidateUnknownCauseDiscardsCompute(t *testing.T) {
	c, _, _ := newTestCache(t)
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := c.GetOrCompute(context.Background(), "r", "k", func(context.Context) (blob, error) {
			close(started)
			<-finish
			return blob("old"), nil
		})
		done <- err
	}()
	<-started
	c.Invalidate(func(k string, _ blob) bool { return k == "k" }, 0)
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c.Contains("k") {
		t.Fatal("a value read before the invalidation entered the cache")
	}
	c.Release("r")
	if s := c.Stats(); s.Bytes != 0 || s.Pinned != 0 {
		t.Fatalf("stats %+v", s)
	}
}

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

// TestTouchOutlastsHits: Touch extends a sliding entry's expiry to at
// least the time given; a later hit extends it by the TTL from now, but
// never takes the Touch back.
func TestTouchOutlastsHits(t *testing.T) {
	c, clock, _ := newTestCache(t) // TTL of a minute
	mustPut(t, c, "", "a", blob("a"))
	if !c.Touch("a", clock.Now().Add(time.Hour)) {
		t.Fatal("Touch")
	}
	if _, ok, _ := c.Get("r", "a"); !ok {
		t.Fatal("miss")
	}
	c.Release("r")
	clock.Advance(30 * time.Minute)
	if !c.Contains("a") {
		t.Fatal("a hit cut short the expiry Touch had given")
	}
	clock.Advance(31 * time.Minute)
	if c.Contains("a") {
		t.Fatal("the entry outlived its Touch")
	}
}

// TestInvalidateNilMatch: a nil match matches nothing; it does not panic
// with the cache's lock held.
func TestInvalidateNilMatch(t *testing.T) {
	c, _, _ := newTestCache(t)
	mustPut(t, c, "", "k", blob("v"))
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("Invalidate(nil) panicked: %v", r)
			}
		}()
		if n := c.Invalidate(nil, CauseInvalidated); n != 0 {
			t.Errorf("Invalidate(nil) matched %d", n)
		}
	}()
	if !c.mu.TryLock() {
		t.Fatal("the cache's lock is still held")
	}
	c.mu.Unlock()
	if !c.Contains("k") {
		t.Fatal("entry lost")
	}
}

// TestPropertiesMore is TestProperties with the calls it leaves out:
// GetOrCompute, Evict (with any cause, named or not), Remove, Touch, and
// fixed expiries. After each step: no pinned value was reported evicted,
// every value handed out is its key's, and the counters agree with the
// contents.
func TestPropertiesMore(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const maxBytes, maxEntries = 1000, 8
		clock := fakeclock.New(time.Unix(1_700_000_000, 0))
		pinsOf := map[uint64]int{}       // value id -> pins the model holds
		reqPins := map[string][]uint64{} // request -> value ids it pinned
		keyOf := map[uint64]string{}     // value id -> the key it was made for
		// mu guards pinsOf and evictedPinned: a compute's evictions are
		// reported from its goroutine, after its callers have their value.
		var mu sync.Mutex
		evictedPinned := ""
		onEvict := func(k string, v blob, cause Cause) {
			mu.Lock()
			defer mu.Unlock()
			if id := binary.LittleEndian.Uint64(v); pinsOf[id] > 0 {
				evictedPinned = fmt.Sprintf("%s (value %d, %d pins) evicted by %v", k, id, pinsOf[id], cause)
			}
			if cause < CauseSize || cause >= numCauses {
				evictedPinned = fmt.Sprintf("%s evicted with unknown cause %v", k, cause)
			}
		}
		fixed := rapid.Bool().Draw(t, "fixed")
		c, err := New(Options[string, blob]{Budget: Budget{MaxBytes: maxBytes, MaxEntries: maxEntries, TTL: time.Minute, Clock: clock}, OnEvict: onEvict, Expiry: func(k string, _ blob) (time.Time, bool) {
			return clock.Now().Add(30 * time.Second), fixed && k < "e"
		}})
		if err != nil {
			t.Fatal(err)
		}
		var nextID uint64
		newValue := func(t *rapid.T, key string) blob {
			nextID++
			keyOf[nextID] = key
			v := make(blob, rapid.IntRange(8, 400).Draw(t, "size"))
			binary.LittleEndian.PutUint64(v, nextID)
			return v
		}
		pinned := func(t *rapid.T, req, key string, v blob) {
			id := binary.LittleEndian.Uint64(v)
			if keyOf[id] != key {
				t.Fatalf("asked for %s, got value %d of %s", key, id, keyOf[id])
			}
			mu.Lock()
			pinsOf[id]++
			mu.Unlock()
			reqPins[req] = append(reqPins[req], id)
		}
		keyGen := rapid.SampledFrom([]string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"})
		reqGen := rapid.SampledFrom([]string{"r1", "r2", "r3"})
		t.Repeat(map[string]func(*rapid.T){
			"put": func(t *rapid.T) {
				key := keyGen.Draw(t, "key")
				if err := c.Put("", key, newValue(t, key)); err != nil {
					t.Fatal(err)
				}
			},
			"compute": func(t *rapid.T) {
				req, key := reqGen.Draw(t, "req"), keyGen.Draw(t, "key")
				fresh := newValue(t, key) // made here: the compute runs in a goroutine of its own
				v, err := c.GetOrCompute(context.Background(), req, key, func(context.Context) (blob, error) {
					return fresh, nil
				})
				if err != nil {
					t.Fatal(err)
				}
				pinned(t, req, key, v)
			},
			"get": func(t *rapid.T) {
				req, key := reqGen.Draw(t, "req"), keyGen.Draw(t, "key")
				if v, ok, _ := c.Get(req, key); ok {
					pinned(t, req, key, v)
				}
			},
			"release": func(t *rapid.T) {
				req := reqGen.Draw(t, "req")
				ids := reqPins[req]
				delete(reqPins, req)
				mu.Lock()
				for _, id := range ids {
					pinsOf[id]--
				}
				mu.Unlock()
				if n := c.Release(req); n != len(ids) {
					t.Fatalf("released %d pins, model holds %d", n, len(ids))
				}
			},
			"evict": func(t *rapid.T) {
				key := keyGen.Draw(t, "key")
				had := c.Contains(key)
				got := c.Evict(key, Cause(rapid.IntRange(0, 7).Draw(t, "cause")))
				if had && !got {
					t.Fatalf("Evict(%s) found nothing, Contains did", key)
				}
				if c.Contains(key) {
					t.Fatalf("%s still there after Evict", key)
				}
			},
			"remove": func(t *rapid.T) { c.Remove(keyGen.Draw(t, "key")) },
			"touch": func(t *rapid.T) {
				c.Touch(keyGen.Draw(t, "key"), clock.Now().Add(time.Duration(rapid.IntRange(0, 120).Draw(t, "seconds"))*time.Second))
			},
			"advance": func(t *rapid.T) {
				clock.Advance(time.Duration(rapid.IntRange(1, 90).Draw(t, "seconds")) * time.Second)
			},
			"invalidate": func(t *rapid.T) {
				key := keyGen.Draw(t, "key")
				c.Invalidate(func(k string, _ blob) bool { return k == key }, Cause(rapid.IntRange(0, 7).Draw(t, "cause")))
			},
			"sweep": func(*rapid.T) { c.Sweep() },
			"": func(t *rapid.T) {
				mu.Lock()
				bad := evictedPinned
				mu.Unlock()
				if bad != "" {
					t.Fatal(bad)
				}
				checkInvariants(t, c, maxBytes, maxEntries)
			},
		})
		for req := range reqPins {
			c.Release(req)
		}
		c.Sweep()
		checkInvariants(t, c, maxBytes, maxEntries)
	})
}

// TestConcurrentFlights: goroutines compute, hit, release, invalidate and
// evict a few keys at once. No key's compute runs twice at once, every
// caller gets its own key's value, and once every request is released the
// byte and pin counts agree with the contents.
func TestConcurrentFlights(t *testing.T) {
	c, _, _ := newTestCache(t, Options[string, blob]{Budget: Budget{MaxBytes: 64, MaxEntries: 4}})
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
	var running [6]atomic.Int32
	var computes atomic.Int32
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				ki := (g + i) % len(keys)
				key := keys[ki]
				req := fmt.Sprint("g", g, "-", i%3)
				switch i % 7 {
				case 5:
					c.Invalidate(func(k string, _ blob) bool { return k == key }, CauseInvalidated)
				case 6:
					c.Evict(key, CauseStore)
					c.Release(req)
				default:
					v, err := c.GetOrCompute(context.Background(), req, key, func(context.Context) (blob, error) {
						if n := running[ki].Add(1); n != 1 {
							t.Errorf("%d computes of %s at once", n, key)
						}
						defer running[ki].Add(-1)
						computes.Add(1)
						return blob(key + "-value"), nil
					})
					if err != nil || string(v) != key+"-value" {
						t.Errorf("%s: got %q, %v", key, v, err)
						return
					}
				}
			}
			for i := range 3 {
				c.Release(fmt.Sprint("g", g, "-", i))
			}
		})
	}
	wg.Wait()
	for _, k := range keys {
		if err := c.Wait(t.Context(), k); err != nil {
			t.Fatal(err)
		}
	}
	checkInvariants(t, c, 64, 4)
	if s := c.Stats(); s.Pinned != 0 || s.Requests != 0 || s.InFlight != 0 || s.Computes != uint64(computes.Load()) {
		t.Fatalf("stats %+v, %d computes ran", s, computes.Load())
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
