package localcache

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/fakeclock"
	"pgregory.net/rapid"
)

// TestProperties runs random sequences of operations and checks after each
// one: unpinned entries exist only while the cache is within budget, a
// pinned value is never evicted, and the counters agree with the contents.
func TestProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const maxBytes, maxEntries = 1000, 8
		clock := fakeclock.New(time.Unix(1_700_000_000, 0))
		pinsOf := map[uint64]int{}       // value id -> pins the model holds
		reqPins := map[string][]uint64{} // request -> value ids it pinned
		evictedPinned := ""
		var c *Cache[string, blob]
		onEvict := func(k string, v blob, cause Cause) {
			if id := binary.LittleEndian.Uint64(v); pinsOf[id] > 0 {
				evictedPinned = fmt.Sprintf("%s (value %d, %d pins) evicted by %v", k, id, pinsOf[id], cause)
			}
		}
		c, err := New(Options[string, blob]{Budget: Budget{MaxBytes: maxBytes, MaxEntries: maxEntries, TTL: time.Minute, Clock: clock}, OnEvict: onEvict})
		if err != nil {
			t.Fatal(err)
		}
		var nextID uint64
		gets := uint64(0)
		keyGen := rapid.SampledFrom([]string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"})
		reqGen := rapid.SampledFrom([]string{"", "r1", "r2", "r3"})
		t.Repeat(map[string]func(*rapid.T){
			"put": func(t *rapid.T) {
				nextID++
				v := make(blob, rapid.IntRange(8, 400).Draw(t, "size"))
				binary.LittleEndian.PutUint64(v, nextID)
				req, key := reqGen.Draw(t, "req"), keyGen.Draw(t, "key")
				if err := c.Put(req, key, v); err != nil {
					t.Fatal(err)
				}
				if req != "" {
					got, _, _ := c.Get(req, key) // learn which value the pin is on
					gets++
					id := binary.LittleEndian.Uint64(got)
					pinsOf[id] += 2
					reqPins[req] = append(reqPins[req], id, id)
				}
			},
			"get": func(t *rapid.T) {
				req := reqGen.Filter(func(s string) bool { return s != "" }).Draw(t, "req")
				v, ok, _ := c.Get(req, keyGen.Draw(t, "key"))
				gets++
				if ok {
					id := binary.LittleEndian.Uint64(v)
					pinsOf[id]++
					reqPins[req] = append(reqPins[req], id)
				}
			},
			"release": func(t *rapid.T) {
				req := reqGen.Draw(t, "req")
				ids := reqPins[req]
				delete(reqPins, req)
				for _, id := range ids {
					pinsOf[id]--
				}
				if n := c.Release(req); n != len(ids) {
					t.Fatalf("released %d pins, model holds %d", n, len(ids))
				}
			},
			"advance": func(t *rapid.T) {
				clock.Advance(time.Duration(rapid.IntRange(1, 90).Draw(t, "seconds")) * time.Second)
			},
			"invalidate": func(t *rapid.T) {
				key := keyGen.Draw(t, "key")
				c.Invalidate(func(k string, _ blob) bool { return k == key }, CauseInvalidated)
			},
			"sweep": func(*rapid.T) { c.Sweep() },
			"": func(t *rapid.T) {
				if evictedPinned != "" {
					t.Fatal(evictedPinned)
				}
				checkInvariants(t, c, maxBytes, maxEntries)
				if s := c.Stats(); s.Hits+s.Misses != gets {
					t.Fatalf("hits %d + misses %d != %d gets", s.Hits, s.Misses, gets)
				}
			},
		})
	})
}

// fataler is *rapid.T or *testing.T.
type fataler interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// checkInvariants walks the cache's internals.
func checkInvariants(t fataler, c *Cache[string, blob], maxBytes int64, maxEntries int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pins := map[*entry[blob]]int{}
	for _, set := range c.requests {
		if len(set.entries) == 0 {
			t.Fatal("a request with an empty pin set")
		}
		for _, e := range set.entries {
			pins[e]++
		}
	}
	var bytes int64
	for e, n := range pins {
		if e.pins != n {
			t.Fatalf("entry has %d pins, requests hold %d", e.pins, n)
		}
		if e.detached != 0 {
			bytes += e.size // out of the index, still held
		}
	}
	pinned, unpinned := 0, 0
	for _, k := range c.lru.Keys() {
		e, _ := c.lru.Peek(k)
		if e.detached != 0 {
			t.Fatalf("%s detached but in the index", k)
		}
		if e.pins > 0 {
			pinned++
		} else {
			unpinned++
		}
		bytes += e.size
	}
	if pinned != c.pinned {
		t.Fatalf("pinned counter %d, index holds %d pinned", c.pinned, pinned)
	}
	if bytes != c.bytes {
		t.Fatalf("bytes counter %d, contents %d", c.bytes, bytes)
	}
	if unpinned > 0 && (c.bytes > maxBytes || c.lru.Len() > maxEntries) {
		t.Fatalf("over budget (%d bytes, %d entries) with %d unpinned entries", c.bytes, c.lru.Len(), unpinned)
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
