package localcache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/fakeclock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// blob is a test value weighing its length.
type blob []byte

func (b blob) Size() int64 { return int64(len(b)) }

type evictLog struct {
	mu     sync.Mutex
	causes map[string]Cause
}

func (l *evictLog) record(k string, _ blob, c Cause) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.causes == nil {
		l.causes = map[string]Cause{}
	}
	l.causes[k] = c
}

func (l *evictLog) cause(k string) Cause {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.causes[k]
}

// newTestCache is a cache of o, on a fake clock, with a TTL of a minute
// and its evictions logged.
func newTestCache(t *testing.T, o ...Options[string, blob]) (*Cache[string, blob], *fakeclock.Clock, *evictLog) {
	t.Helper()
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	log := &evictLog{}
	var opts Options[string, blob]
	if len(o) > 0 {
		opts = o[0]
	}
	opts.Clock, opts.TTL, opts.OnEvict = clock, time.Minute, log.record
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c, clock, log
}

func mustPut(t *testing.T, c *Cache[string, blob], req, key string, v blob) {
	t.Helper()
	if err := c.Put(req, key, v); err != nil {
		t.Fatal(err)
	}
}

func TestLRUEvictsByBytes(t *testing.T) {
	c, _, log := newTestCache(t, Options[string, blob]{Budget: Budget{MaxBytes: 300}})
	mustPut(t, c, "", "a", make(blob, 100))
	mustPut(t, c, "", "b", make(blob, 100))
	mustPut(t, c, "", "c", make(blob, 100))
	if _, ok, _ := c.Get("r", "a"); !ok { // a is now most recent
		t.Fatal("a missing")
	}
	c.Release("r")
	mustPut(t, c, "", "d", make(blob, 100))
	if c.Contains("b") || !c.Contains("a") || !c.Contains("c") || !c.Contains("d") {
		t.Fatal("the least recently used entry was not the one evicted")
	}
	if log.cause("b") != CauseSize {
		t.Fatalf("b evicted with cause %v, want size", log.cause("b"))
	}
	if s := c.Stats(); s.Bytes != 300 || s.Entries != 3 || s.Evicted(CauseSize) != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestLRUEvictsByCount(t *testing.T) {
	c, _, log := newTestCache(t, Options[string, blob]{Budget: Budget{MaxEntries: 2}})
	for _, k := range []string{"a", "b", "c"} {
		mustPut(t, c, "", k, blob(k))
	}
	if c.Contains("a") || c.Stats().Entries != 2 || log.cause("a") != CauseSize {
		t.Fatal("count limit not enforced")
	}
}

func TestTTLEviction(t *testing.T) {
	c, clock, log := newTestCache(t)
	mustPut(t, c, "", "a", blob("x"))
	clock.Advance(59 * time.Second)
	if _, ok, _ := c.Get("r", "a"); !ok {
		t.Fatal("entry expired early")
	}
	c.Release("r")
	clock.Advance(59 * time.Second) // a hit extends the TTL
	if !c.Contains("a") {
		t.Fatal("a hit did not extend the TTL")
	}
	clock.Advance(2 * time.Second)
	if _, ok, _ := c.Get("r", "a"); ok {
		t.Fatal("expired entry served")
	}
	if log.cause("a") != CauseTTL || c.Stats().Entries != 0 {
		t.Fatalf("cause %v, stats %+v", log.cause("a"), c.Stats())
	}
	mustPut(t, c, "", "b", blob("y"))
	clock.Advance(2 * time.Minute)
	if n := c.Sweep(); n != 1 || c.Stats().Bytes != 0 {
		t.Fatalf("sweep dropped %d", n)
	}
}

func TestPinnedSurvivesTTLAndSize(t *testing.T) {
	c, clock, log := newTestCache(t, Options[string, blob]{Budget: Budget{MaxBytes: 200}})
	mustPut(t, c, "stream", "voice", make(blob, 100)) // inserted pinned
	clock.Advance(10 * time.Minute)
	for _, k := range []string{"x", "y", "z"} {
		mustPut(t, c, "", k, make(blob, 100))
	}
	if log.cause("voice") != 0 {
		t.Fatalf("pinned entry evicted (%v)", log.cause("voice"))
	}
	if s := c.Stats(); s.Pinned != 1 || s.PinnedBytes != 100 || s.Bytes > 200 {
		t.Fatalf("stats %+v", s)
	}
	if _, ok, _ := c.Get("other", "voice"); ok {
		t.Fatal("an expired entry was served to a new request")
	}
	if n := c.Release("stream"); n != 1 {
		t.Fatalf("released %d pins, want 1", n)
	}
	if log.cause("voice") != CauseTTL {
		t.Fatalf("expired entry not dropped on its final release: %v", log.cause("voice"))
	}
	if s := c.Stats(); s.Bytes != 100 || s.Pinned != 0 || s.Requests != 0 {
		t.Fatalf("stats after release %+v", s)
	}
}

func TestPinnedHoldsAboveBudgetUntilReleased(t *testing.T) {
	c, _, _ := newTestCache(t, Options[string, blob]{Budget: Budget{MaxBytes: 200}})
	mustPut(t, c, "r1", "a", make(blob, 150))
	mustPut(t, c, "r2", "b", make(blob, 150))
	if s := c.Stats(); s.Bytes != 300 || s.Entries != 2 {
		t.Fatalf("pinned entries evicted: %+v", s)
	}
	c.Release("r1")
	if s := c.Stats(); s.Bytes != 150 || c.Contains("a") || !c.Contains("b") {
		t.Fatalf("after release: %+v", s)
	}
}

func TestReleaseDropsEveryPin(t *testing.T) {
	c, _, _ := newTestCache(t)
	mustPut(t, c, "", "a", blob("1"))
	mustPut(t, c, "req", "b", blob("2"))
	for range 3 {
		if _, ok, _ := c.Get("req", "a"); !ok {
			t.Fatal("miss")
		}
	}
	if _, ok, _ := c.Get("other", "a"); !ok {
		t.Fatal("miss")
	}
	if n := c.Release("req"); n != 4 {
		t.Fatalf("released %d pins, want 4", n)
	}
	if s := c.Stats(); s.Pinned != 1 || s.Requests != 1 {
		t.Fatalf("other request's pin lost: %+v", s)
	}
	if c.Release("req") != 0 || c.Release("other") != 1 || c.Stats().Pinned != 0 {
		t.Fatal("release is not idempotent")
	}
}

func TestPutFirstWriterWins(t *testing.T) {
	c, _, _ := newTestCache(t)
	mustPut(t, c, "", "k", blob("first"))
	mustPut(t, c, "r", "k", blob("second"))
	v, _, _ := c.Get("r", "k")
	if string(v) != "first" || c.Stats().Entries != 1 {
		t.Fatalf("got %q", v)
	}
	c.Release("r")
}

func TestOversizedRefused(t *testing.T) {
	c, _, _ := newTestCache(t, Options[string, blob]{Budget: Budget{MaxBytes: 10}})
	if err := c.Put("r", "k", make(blob, 11)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Put: %v", err)
	}
	_, err := c.GetOrCompute(t.Context(), "r", "k", func(context.Context) (blob, error) { return make(blob, 11), nil })
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("GetOrCompute: %v", err)
	}
	if s := c.Stats(); s.Entries != 0 || s.Pinned != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestInvalidate(t *testing.T) {
	c, _, log := newTestCache(t)
	mustPut(t, c, "", "epoch1/a", blob("a"))
	mustPut(t, c, "holder", "epoch1/b", blob("b"))
	mustPut(t, c, "", "epoch2/c", blob("c"))
	n := c.Invalidate(func(k string, _ blob) bool { return k[:6] == "epoch1" }, CauseInvalidated)
	if n != 2 {
		t.Fatalf("invalidated %d", n)
	}
	if c.Contains("epoch1/a") || c.Contains("epoch1/b") || !c.Contains("epoch2/c") {
		t.Fatal("wrong entries left")
	}
	if log.cause("epoch1/a") != CauseInvalidated || log.cause("epoch1/b") != 0 {
		t.Fatal("a pinned entry was dropped before its release")
	}
	// The key can be recomputed while the old value is still held.
	mustPut(t, c, "", "epoch1/b", blob("B"))
	c.Release("holder")
	if log.cause("epoch1/b") != CauseInvalidated {
		t.Fatal("invalidated entry not dropped on release")
	}
	if v, ok, _ := c.Get("r", "epoch1/b"); !ok || string(v) != "B" {
		t.Fatalf("new value lost: %q %v", v, ok)
	}
	c.Release("r")
	if !c.Remove("epoch2/c") || c.Remove("epoch2/c") || log.cause("epoch2/c") != CauseExplicit {
		t.Fatal("Remove")
	}
	if s := c.Stats(); s.Bytes != 1 || s.Entries != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestTouch(t *testing.T) {
	c, clock, _ := newTestCache(t)
	mustPut(t, c, "", "a", blob("a"))
	if !c.Touch("a", clock.Now().Add(time.Hour)) || c.Touch("missing", clock.Now()) {
		t.Fatal("Touch")
	}
	clock.Advance(30 * time.Minute)
	if !c.Contains("a") {
		t.Fatal("Touch did not extend the expiry")
	}
}

func TestCloneOnGet(t *testing.T) {
	c, _, _ := newTestCache(t, Options[string, blob]{CloneOnGet: func(b blob) blob { return bytes.Clone(b) }})
	mustPut(t, c, "", "k", blob("abc"))
	v, _, _ := c.Get("r", "k")
	v[0] = 'X'
	w, _, _ := c.Get("r", "k")
	if string(w) != "abc" {
		t.Fatalf("mutation reached the cache: %q", w)
	}
	c.Release("r")
}

func TestMutationGuard(t *testing.T) {
	var mu sync.Mutex
	var reported []string
	sum := func(b blob) uint64 {
		var h uint64 = 14695981039346656037
		for _, x := range b {
			h = (h ^ uint64(x)) * 1099511628211
		}
		return h
	}
	c, _, _ := newTestCache(t, Options[string, blob]{Checksum: sum, OnMutation: func(k string) {
		mu.Lock()
		reported = append(reported, k)
		mu.Unlock()
	}})
	mustPut(t, c, "", "k", blob("abc"))
	v, _, _ := c.Get("r", "k")
	v[1] = 'Z' // a holder writes into a shared value
	c.Release("r")
	mustPut(t, c, "", "clean", blob("ok"))
	w, _, _ := c.Get("r2", "clean")
	_ = w
	c.Release("r2")
	if s := c.Stats(); s.Mutations != 1 || len(reported) != 1 || reported[0] != "k" {
		t.Fatalf("mutations %d, reported %v", s.Mutations, reported)
	}
}

func TestOptionsValidated(t *testing.T) {
	for _, o := range []Options[string, blob]{{Budget: Budget{MaxBytes: -1}}, {Budget: Budget{MaxEntries: -1}},
		{Budget: Budget{TTL: -time.Second}}, {ComputeTimeout: -time.Second}, {OnMutation: func(string) {}}} {
		if _, err := New(o); !errors.Is(err, ErrInvalidOption) {
			t.Fatalf("%+v: got %v, want ErrInvalidOption", o, err)
		}
	}
	c, _, _ := newTestCache(t)
	if _, _, err := c.Get("", "k"); !errors.Is(err, ErrNoRequest) {
		t.Fatal("empty request id accepted")
	}
}

// An entry with its own expiry (Options.Expiry) keeps it: hits do not extend
// it, Touch does; others slide as before.
func TestFixedExpiry(t *testing.T) {
	var base time.Time
	c, clock, log := newTestCache(t, Options[string, blob]{Expiry: func(k string, _ blob) (time.Time, bool) {
		return base.Add(10 * time.Second), k != "sliding"
	}})
	base = clock.Now()
	mustPut(t, c, "", "fixed", blob("f"))
	mustPut(t, c, "", "touched", blob("t"))
	mustPut(t, c, "", "sliding", blob("s"))
	for range 3 { // hits every 5 s: the sliding one lives on, the fixed ones do not
		clock.Advance(5 * time.Second)
		for _, k := range []string{"fixed", "touched", "sliding"} {
			c.Get("r", k)
		}
		c.Release("r")
		if k := "touched"; c.Contains(k) {
			c.Touch(k, clock.Now().Add(10*time.Second))
		}
	}
	if c.Contains("fixed") || log.cause("fixed") != CauseTTL {
		t.Fatalf("a hit extended a fixed expiry (%v)", log.cause("fixed"))
	}
	if !c.Contains("touched") || !c.Contains("sliding") {
		t.Fatal("Touch or a hit did not extend")
	}
}

// A compute that an Invalidate overtakes answers its waiters but stays
// out of the index, and goes with its waiters' release.
func TestInvalidateOvertakesCompute(t *testing.T) {
	c, _, log := newTestCache(t)
	started, finish := make(chan struct{}), make(chan struct{})
	got := make(chan blob, 1)
	go func() {
		v, err := c.GetOrCompute(context.Background(), "r", "k", func(context.Context) (blob, error) {
			close(started)
			<-finish
			return blob("old"), nil
		})
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	<-started
	if n := c.Invalidate(func(k string, _ blob) bool { return k == "k" }, CauseStore); n != 0 {
		t.Fatalf("%d entries matched; the key was only computing", n)
	}
	close(finish)
	if v := <-got; string(v) != "old" {
		t.Fatalf("the waiter got %q", v)
	}
	if c.Contains("k") {
		t.Fatal("a value read before the invalidation entered the cache")
	}
	if log.cause("k") != 0 {
		t.Fatal("dropped while its waiter holds it")
	}
	c.Release("r")
	if log.cause("k") != CauseStore || c.Stats().Bytes != 0 {
		t.Fatalf("cause %v, stats %+v", log.cause("k"), c.Stats())
	}
}

// Stats' evictions read in JSON by cause name, and back.
func TestEvictionsJSON(t *testing.T) {
	var e Evictions
	e[CauseStore], e[CauseTTL] = 3, 1
	b, err := json.Marshal(e)
	if err != nil || string(b) != `{"explicit":0,"invalidated":0,"size":0,"store":3,"ttl":1}` {
		t.Fatalf("%s %v", b, err)
	}
	var back Evictions
	if err := json.Unmarshal(b, &back); err != nil || back != e {
		t.Fatalf("%v %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"weather":1}`), &back); err == nil {
		t.Fatal("an unknown cause was read")
	}
}
