package localcache

import (
	"encoding/binary"
	"fmt"
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
