package shm

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
)

var benchSizes = []int{8 << 20, 100 << 20}

// timeAlternating runs ours and base alternately b.N times each, so both
// see the same machine state, and reports their ratio and our rate.
func timeAlternating(b *testing.B, bytes int, ours, base func()) {
	var tOurs, tBase time.Duration
	for b.Loop() {
		t0 := time.Now()
		ours()
		t1 := time.Now()
		base()
		tBase += time.Since(t1)
		tOurs += t1.Sub(t0)
	}
	n := float64(b.N)
	b.ReportMetric(float64(tOurs.Microseconds())/n, "us/op-ours")
	b.ReportMetric(float64(tBase.Microseconds())/n, "us/op-copy")
	b.ReportMetric(float64(tOurs)/float64(tBase), "x-copy")
	b.ReportMetric(float64(bytes)*n/tOurs.Seconds()/1e9, "GB/s")
}

// BenchmarkGet: a get maps the file (with the trailer check); the
// baseline is a bare copy of the same bytes.
func BenchmarkGet(b *testing.B) {
	for _, size := range benchSizes {
		for _, verify := range []bool{false, true} {
			b.Run(fmt.Sprintf("%dMiB/verify=%v", size>>20, verify), func(b *testing.B) {
				dir := testDir(b)
				s, err := Open(dir, WithVerifyData(verify))
				if err != nil {
					b.Fatal(err)
				}
				v := payload.NewTensor(cachekey.Uint8, []int64{int64(size)}, make([]byte, size))
				loc, err := s.Put(context.Background(), obj(1), v)
				if err != nil {
					b.Fatal(err)
				}
				dst := make([]byte, size)
				timeAlternating(b, size, func() {
					got, err := s.Get(context.Background(), loc)
					if err != nil {
						b.Fatal(err)
					}
					_ = got.Tensor.Data[size-1] // touch the mapping
					got.Close()
				}, func() { copy(dst, v.Tensor.Data) })
			})
		}
	}
}

// BenchmarkPutGet: write a value to tmpfs (checksum included), map it
// back, delete it; the baseline is a bare copy of the same bytes.
func BenchmarkPutGet(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			s, err := Open(testDir(b))
			if err != nil {
				b.Fatal(err)
			}
			v := payload.NewTensor(cachekey.Uint8, []int64{int64(size)}, make([]byte, size))
			dst := make([]byte, size)
			ctx := context.Background()
			timeAlternating(b, size, func() {
				loc, err := s.Put(ctx, obj(2), v)
				if err != nil {
					b.Fatal(err)
				}
				got, err := s.Get(ctx, loc)
				if err != nil {
					b.Fatal(err)
				}
				got.Close()
				s.Delete(ctx, loc)
			}, func() { copy(dst, v.Tensor.Data) })
		})
	}
}
