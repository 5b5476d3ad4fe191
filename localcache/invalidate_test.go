package localcache

import (
	"context"
	"testing"
)

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
