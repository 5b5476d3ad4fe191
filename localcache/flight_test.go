package localcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestSingleFlight: N concurrent misses of one key run compute once and all
// get the same value, each pinned for its own request.
func TestSingleFlight(t *testing.T) {
	for _, n := range []int{10, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, _, _ := newTestCache(t)
				var calls atomic.Int32
				release := make(chan struct{})
				fn := func(context.Context) (blob, error) {
					calls.Add(1)
					<-release
					return blob("embedding"), nil
				}
				results := make([]blob, n)
				errs := make([]error, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						results[i], errs[i] = c.GetOrCompute(t.Context(), fmt.Sprint("req", i), "k", fn)
					})
				}
				synctest.Wait() // every caller is blocked: one in fn, the rest waiting
				if s := c.Stats(); s.Computes != 1 || s.Waits != uint64(n-1) || s.InFlight != 1 {
					t.Fatalf("before release: %+v", s)
				}
				close(release)
				wg.Wait()
				if calls.Load() != 1 {
					t.Fatalf("compute ran %d times", calls.Load())
				}
				for i := range n {
					if errs[i] != nil || string(results[i]) != "embedding" {
						t.Fatalf("caller %d: %q %v", i, results[i], errs[i])
					}
				}
				if s := c.Stats(); s.Pinned != 1 || s.Requests != n || s.InFlight != 0 {
					t.Fatalf("after: %+v", s)
				}
				for i := range n {
					c.Release(fmt.Sprint("req", i))
				}
				if s := c.Stats(); s.Pinned != 0 || s.Entries != 1 {
					t.Fatalf("after release: %+v", s)
				}
			})
		})
	}
}

func TestComputeFailureReachesEveryWaiterAndRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := newTestCache(t)
		boom := errors.New("encoder OOM")
		release := make(chan struct{})
		fail := func(context.Context) (blob, error) { <-release; return nil, boom }
		errs := make(chan error, 10)
		for i := range 10 {
			go func() {
				_, err := c.GetOrCompute(t.Context(), fmt.Sprint(i), "k", fail)
				errs <- err
			}()
		}
		synctest.Wait()
		close(release)
		for range 10 {
			if err := <-errs; !errors.Is(err, boom) {
				t.Fatalf("waiter got %v", err)
			}
		}
		if s := c.Stats(); s.ComputeErrors != 1 || s.Entries != 0 || s.InFlight != 0 {
			t.Fatalf("stats %+v", s)
		}
		v, err := c.GetOrCompute(t.Context(), "retry", "k", func(context.Context) (blob, error) { return blob("ok"), nil })
		if err != nil || string(v) != "ok" {
			t.Fatalf("retry: %q %v", v, err)
		}
		c.Release("retry")
	})
}

func TestWaiterCancelLeavesComputeRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := newTestCache(t)
		release := make(chan struct{})
		computed := make(chan struct{})
		fn := func(ctx context.Context) (blob, error) {
			<-release
			close(computed)
			return blob("v"), ctx.Err()
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 2)
		go func() { _, err := c.GetOrCompute(ctx, "impatient", "k", fn); done <- err }()
		go func() { _, err := c.GetOrCompute(t.Context(), "patient", "k", fn); done <- err }()
		synctest.Wait()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter got %v", err)
		}
		close(release)
		<-computed
		if err := <-done; err != nil {
			t.Fatalf("patient waiter got %v: the compute was cancelled with the caller", err)
		}
		synctest.Wait()
		if s := c.Stats(); s.Requests != 1 || s.Pinned != 1 {
			t.Fatalf("the cancelled request holds a pin: %+v", s)
		}
		c.Release("patient")
	})
}

func TestComputeTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := newTestCache(t, Options[string, blob]{ComputeTimeout: 5 * time.Second})
		stuck := make(chan struct{})
		start := time.Now()
		_, err := c.GetOrCompute(t.Context(), "r", "k", func(context.Context) (blob, error) {
			<-stuck // ignores its context
			return blob("late"), nil
		})
		if !errors.Is(err, ErrComputeTimeout) || time.Since(start) != 5*time.Second {
			t.Fatalf("got %v after %v", err, time.Since(start))
		}
		close(stuck)
		synctest.Wait()
		if !c.Contains("k") || c.Stats().Pinned != 0 {
			t.Fatal("the late value was lost or pinned for a caller that left")
		}
		_, err = c.GetOrCompute(t.Context(), "r", "k2", func(ctx context.Context) (blob, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		if !errors.Is(err, ErrComputeTimeout) {
			t.Fatalf("compute honouring its context: %v", err)
		}
	})
}

func TestComputePanicIsAnError(t *testing.T) {
	c, _, _ := newTestCache(t)
	_, err := c.GetOrCompute(t.Context(), "r", "k", func(context.Context) (blob, error) { panic("bad tensor") })
	if !errors.Is(err, ErrComputePanicked) {
		t.Fatalf("got %v", err)
	}
}

func TestGetOrComputeHitPins(t *testing.T) {
	c, _, _ := newTestCache(t)
	mustPut(t, c, "", "k", blob("v"))
	v, err := c.GetOrCompute(t.Context(), "r", "k", func(context.Context) (blob, error) {
		t.Fatal("computed on a hit")
		return nil, nil
	})
	if err != nil || string(v) != "v" || c.Stats().Pinned != 1 || c.Stats().Hits != 1 {
		t.Fatalf("%q %v %+v", v, err, c.Stats())
	}
	c.Release("r")
}

// TestGetOrStartNeverJoins: GetOrStart returns ErrInFlight while another
// caller's compute runs, and computes (or hits) otherwise.
func TestGetOrStartNeverJoins(t *testing.T) {
	c, _, _ := newTestCache(t)
	release := make(chan struct{})
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := c.GetOrCompute(context.Background(), "a", "k", func(context.Context) (blob, error) {
			close(started)
			<-release
			return blob("one"), nil
		})
		done <- err
	}()
	<-started
	if _, err := c.GetOrStart(context.Background(), "b", "k", func(context.Context) (blob, error) {
		t.Error("a second compute ran")
		return nil, nil
	}); !errors.Is(err, ErrInFlight) {
		t.Fatalf("while computing: %v, want ErrInFlight", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v, err := c.GetOrStart(context.Background(), "c", "k", nil); err != nil || string(v) != "one" {
		t.Fatalf("after: %q %v", v, err)
	}
	if v, err := c.GetOrStart(context.Background(), "b", "k2", func(context.Context) (blob, error) { return blob("two"), nil }); err != nil || string(v) != "two" {
		t.Fatalf("no flight: %q %v", v, err)
	}
}

// TestWaitPinsNothing: Wait returns at once without a compute, waits for
// a running one to land, and pins, counts and starts nothing.
func TestWaitPinsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := newTestCache(t)
		if err := c.Wait(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		go c.GetOrCompute(t.Context(), "a", "k", func(context.Context) (blob, error) {
			<-release
			return blob("one"), nil
		})
		synctest.Wait() // computing
		waited := make(chan error, 1)
		go func() { waited <- c.Wait(t.Context(), "k") }()
		synctest.Wait()
		select {
		case err := <-waited:
			t.Fatalf("Wait returned %v while the compute ran", err)
		default:
		}
		close(release)
		if err := <-waited; err != nil {
			t.Fatal(err)
		}
		if !c.Contains("k") {
			t.Fatal("Wait returned before the value landed")
		}
		if s := c.Stats(); s.Computes != 1 || s.Waits != 0 || s.Misses != 1 || s.Hits != 0 || s.Pinned != 1 {
			t.Fatalf("Wait counted or pinned: %+v", s)
		}
		c.Release("a")
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
