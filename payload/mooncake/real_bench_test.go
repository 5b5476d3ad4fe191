//go:build mooncake && cgo

package mooncake

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/mooncaketest"
	"github.com/embcache/embcache/internal/workload"
)

// BenchmarkRealMooncakeGet reads 1, 8 and 100 MiB values from a real
// Mooncake Store whose segment another process holds (the cross-process
// get a reader on another node makes, over loopback TCP here) and,
// alternately, the same bytes over a bare TCP connection; x-bare-tcp is
// their ratio. Needs a real store (make test-mooncake's, or MOONCAKE_DIR).
func BenchmarkRealMooncakeGet(b *testing.B) {
	c := startMaster(b, mooncaketest.Dir(b))
	startHolder(b, c, 512<<20)
	cfg := c.config("reader", 0)
	cfg.LocalBufferSize = 256 << 20 // a transfer needs a buffer as large as the value (-600 otherwise)
	s, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for i, size := range []int{1 << 20, 8 << 20, 100 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			o := obj
			o.Key[3] = byte(0x70 + i)
			loc, err := s.Put(ctx, o, value(size))
			if err != nil {
				b.Fatal(err)
			}
			addr, stop, err := workload.BareTCPServer(make([]byte, loc.Size))
			if err != nil {
				b.Fatal(err)
			}
			defer stop()
			dst := make([]byte, loc.Size)
			var tGet, tTCP time.Duration
			for b.Loop() {
				t0 := time.Now()
				got, err := s.Get(ctx, loc)
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				got.Close()
				if err := workload.ReadBareTCP(addr, dst); err != nil {
					b.Fatal(err)
				}
				tTCP += time.Since(t1)
				tGet += t1.Sub(t0)
			}
			n := float64(b.N)
			b.ReportMetric(float64(loc.Size)*n/tGet.Seconds()/1e9, "GB/s-get")
			b.ReportMetric(float64(loc.Size)*n/tTCP.Seconds()/1e9, "GB/s-tcp")
			b.ReportMetric(float64(tGet)/float64(tTCP), "x-bare-tcp")
		})
	}
}
