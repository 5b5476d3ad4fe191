package httppull

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/payload"
)

// BenchmarkPull pulls 8 MiB and 100 MiB values over loopback HTTP (with
// checksum verification) and, alternately, the same bytes over a bare TCP
// connection; x-bare-tcp is their ratio (target <= 2, i.e. >= 50 %).
func BenchmarkPull(b *testing.B) {
	for _, size := range []int{8 << 20, 100 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			ctx := context.Background()
			store := payload.NewMemoryStore("a", 0)
			srv := httptest.NewServer(newServer(b, store))
			defer srv.Close()
			tr, err := NewTransport("a", srv.URL, store)
			if err != nil {
				b.Fatal(err)
			}
			v := payload.NewTensor(cachekey.Uint8, []int64{int64(size)}, make([]byte, size))
			loc, err := tr.Put(ctx, testObj, v)
			if err != nil {
				b.Fatal(err)
			}
			addr, stop, err := workload.BareTCPServer(make([]byte, loc.Size))
			if err != nil {
				b.Fatal(err)
			}
			defer stop()
			dst := make([]byte, loc.Size)
			var tPull, tTCP time.Duration
			for b.Loop() {
				t0 := time.Now()
				got, err := tr.Get(ctx, loc)
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				got.Close()
				if err := workload.ReadBareTCP(addr, dst); err != nil {
					b.Fatal(err)
				}
				tTCP += time.Since(t1)
				tPull += t1.Sub(t0)
			}
			n := float64(b.N)
			b.ReportMetric(float64(size)*n/tPull.Seconds()/1e9, "GB/s-pull")
			b.ReportMetric(float64(size)*n/tTCP.Seconds()/1e9, "GB/s-tcp")
			b.ReportMetric(float64(tPull)/float64(tTCP), "x-bare-tcp")
			srv.Client().CloseIdleConnections()
			tr.client.CloseIdleConnections()
		})
	}
}
