package localcache

import (
	"testing"
	"time"
)

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
