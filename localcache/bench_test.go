package localcache

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// BenchmarkHit measures a local hit (Get, which pins; a Release per 4 hits) with 1
// and 2 goroutines, against a bare thread-safe golang-lru Get on the same
// keys, in the same run. It reports the ratio and the hit's p99 latency
// (every 16th hit timed alone).
func BenchmarkHit(b *testing.B) {
	const keys = 1024
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprint("key-", i)
	}
	for _, goroutines := range []int{1, 2} {
		b.Run(fmt.Sprintf("goroutines=%d", goroutines), func(b *testing.B) {
			c, err := New(Options[string, blob]{Budget: Budget{MaxEntries: keys}})
			if err != nil {
				b.Fatal(err)
			}
			bare, _ := lru.New[string, blob](keys)
			for _, k := range names {
				if err := c.Put("", k, blob("v")); err != nil {
					b.Fatal(err)
				}
				bare.Add(k, blob("v"))
			}
			per := b.N/goroutines + 1
			run := func(op func(worker, i int)) time.Duration {
				var wg sync.WaitGroup
				start := time.Now()
				for w := range goroutines {
					wg.Go(func() {
						for i := range per {
							op(w, i)
						}
					})
				}
				wg.Wait()
				return time.Since(start)
			}
			// A request makes a few hits and then releases them all, once.
			reqs := []string{"req-0", "req-1"}
			samples := make([][]time.Duration, goroutines)
			b.ResetTimer()
			ours := run(func(w, i int) {
				k := names[(i*7+w)%keys]
				if i%16 == 0 {
					t0 := time.Now()
					c.Get(reqs[w], k)
					samples[w] = append(samples[w], time.Since(t0))
				} else {
					c.Get(reqs[w], k)
				}
				if i%4 == 3 {
					c.Release(reqs[w])
				}
			})
			b.StopTimer()
			base := run(func(w, i int) {
				k := names[(i*7+w)%keys]
				if i%16 == 0 { // the same timing overhead as ours
					t0 := time.Now()
					bare.Get(k)
					_ = time.Since(t0)
					return
				}
				bare.Get(k)
			})
			all := slices.Concat(samples...)
			slices.Sort(all)
			if len(all) > 0 {
				b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds()), "p99-ns")
				b.ReportMetric(float64(all[len(all)/2].Nanoseconds()), "p50-ns")
			}
			b.ReportMetric(float64(ours)/float64(base), "x-bare-lru")
		})
	}
}
