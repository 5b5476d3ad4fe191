package cachekey

import (
	"fmt"
	"testing"
	"time"

	"github.com/zeebo/blake3"
)

// BenchmarkRawBytesKey compares key construction with a bare blake3.Sum256
// over the same bytes, alternating the two in one loop so both see the same
// machine state; x-bare-blake3 is their ratio (target <= 1.05).
func BenchmarkRawBytesKey(b *testing.B) {
	for _, size := range []int{200 << 10, 2 << 20, 8 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i * 131)
			}
			k := mustKeyer(b, imageConfig())
			b.SetBytes(int64(size))
			var keyed, bare time.Duration
			var sink Key
			for b.Loop() {
				t0 := time.Now()
				sink, _ = k.RawBytes(data)
				t1 := time.Now()
				sink = blake3.Sum256(data)
				bare += time.Since(t1)
				keyed += t1.Sub(t0)
			}
			_ = sink
			b.ReportMetric(float64(keyed)/float64(bare), "x-bare-blake3")
			b.ReportMetric(float64(keyed.Microseconds())/float64(b.N), "us/key")
		})
	}
}

func BenchmarkTensorKey(b *testing.B) {
	data := make([]byte, 2<<20)
	k := mustKeyer(b, imageConfig())
	t := Tensor{DType: BFloat16, Shape: []int64{1024, 1024}, Data: data}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := k.Tensor(t); err != nil {
			b.Fatal(err)
		}
	}
}
