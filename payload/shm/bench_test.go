package shm

import (
	"context"
	"fmt"
	"os"
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
// baseline is a bare copy of the same bytes. With verify=true each Get
// maps the file afresh (the last one closed its value) and trusts the
// writer's proof: nothing is hashed.
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

// BenchmarkVerification: what verifying a file costs a process of the
// node, at 1, 8 and 100 MiB, alternated in the same run with a Get that
// checks the trailer only (map-us; x-map is each one's ratio to it):
// first-us is a process's first Get of a file its writer proved (a node
// proof read), later-us a Get after that process's mapping went (its own
// proof), verify-us the node's first verification (no proof: one hash).
// Each process's first Get is its store's first (map-us's store is new
// each time too).
func BenchmarkVerification(b *testing.B) {
	ctx := context.Background()
	for _, size := range []int{1 << 20, 8 << 20, 100 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			dir := testDir(b)
			open := func(opts ...Option) *Store {
				s, err := Open(dir, opts...)
				if err != nil {
					b.Fatal(err)
				}
				return s
			}
			writer := open()
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i * 7)
			}
			loc, err := writer.Put(ctx, obj(1), payload.NewTensor(cachekey.Uint8, []int64{int64(size)}, data))
			if err != nil {
				b.Fatal(err)
			}
			proof, err := os.ReadFile(writer.proofs.path(obj(1)))
			if err != nil {
				b.Fatal(err)
			}
			get := func(s *Store) time.Duration {
				t0 := time.Now()
				v, err := s.Get(ctx, loc)
				if err != nil {
					b.Fatal(err)
				}
				_ = v.Tensor.Data[size-1]
				v.Close()
				return time.Since(t0)
			}
			later := open()
			get(later)
			var tFirst, tLater, tVerify, tMap time.Duration
			for b.Loop() {
				b.StopTimer()
				first, verifier, plain := open(), open(), open(WithVerifyData(false))
				b.StartTimer()
				tFirst += get(first)
				tLater += get(later)
				tMap += get(plain)
				os.Remove(writer.proofs.path(obj(1)))
				tVerify += get(verifier)
				b.StopTimer()
				if verifier.hashes.Load() != 1 || first.hashes.Load()+later.hashes.Load() != 0 {
					b.Fatal("hashed other than once, by the verifier")
				}
				os.WriteFile(writer.proofs.path(obj(1)), proof, 0o644) // the writer's again
				b.StartTimer()
			}
			n := float64(b.N)
			b.ReportMetric(float64(tFirst.Microseconds())/n, "first-us")
			b.ReportMetric(float64(tLater.Microseconds())/n, "later-us")
			b.ReportMetric(float64(tVerify.Microseconds())/n, "verify-us")
			b.ReportMetric(float64(tMap.Microseconds())/n, "map-us")
			b.ReportMetric(float64(tFirst)/float64(tMap), "first-x-map")
			b.ReportMetric(float64(tVerify)/float64(tMap), "verify-x-map")
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
				seen, _ := s.Generation(ctx, loc)
				s.Delete(ctx, loc, seen)
			}, func() { copy(dst, v.Tensor.Data) })
		})
	}
}
