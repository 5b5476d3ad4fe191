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
// baseline is a bare copy of the same bytes. verify=true is the first Get
// of a file in a process, which hashes it (every Get here: each one closes
// its value, so the next maps the file afresh).
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

// BenchmarkVerifyFirstMap: what verifying a file at its first map costs,
// at 1, 8 and 100 MiB, against the same file's Get without verification,
// alternated in the same run (x-map is their ratio). For scale: x-copy is
// the verifying Get over the non-verifying one plus a copy of the data out
// of the mapping (one pass over the bytes, the least a consumer does), and
// reuse-us is a later Get while the verified mapping is held (no hash).
func BenchmarkVerifyFirstMap(b *testing.B) {
	ctx := context.Background()
	for _, size := range []int{1 << 20, 8 << 20, 100 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			dir := testDir(b)
			verifying, err := Open(dir)
			if err != nil {
				b.Fatal(err)
			}
			plain, err := Open(dir, WithVerifyData(false))
			if err != nil {
				b.Fatal(err)
			}
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i * 7)
			}
			loc, err := verifying.Put(ctx, obj(1), payload.NewTensor(cachekey.Uint8, []int64{int64(size)}, data))
			if err != nil {
				b.Fatal(err)
			}
			get := func(s *Store) *payload.Value {
				v, err := s.Get(ctx, loc)
				if err != nil {
					b.Fatal(err)
				}
				return v
			}
			dst := make([]byte, size)
			var tVerify, tMap, tCopy, tReuse time.Duration
			for b.Loop() {
				t0 := time.Now()
				held := get(verifying) // maps and hashes: no value holds the file
				t1 := time.Now()
				get(verifying).Close() // shares held's mapping
				t2 := time.Now()
				held.Close()
				t3 := time.Now()
				get(plain).Close()
				t4 := time.Now()
				v := get(plain)
				copy(dst, v.Tensor.Data)
				v.Close()
				t5 := time.Now()
				tVerify += t1.Sub(t0)
				tReuse += t2.Sub(t1)
				tMap += t4.Sub(t3)
				tCopy += t5.Sub(t4)
			}
			n := float64(b.N)
			b.ReportMetric(float64(tVerify.Microseconds())/n, "verify-us")
			b.ReportMetric(float64(tMap.Microseconds())/n, "map-us")
			b.ReportMetric(float64(tReuse.Microseconds())/n, "reuse-us")
			b.ReportMetric(float64(tVerify)/float64(tMap), "x-map")
			b.ReportMetric(float64(tVerify)/float64(tCopy), "x-copy")
			b.ReportMetric(float64(size)*n/tVerify.Seconds()/1e9, "GB/s")
		})
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
