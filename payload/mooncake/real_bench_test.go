//go:build mooncake && cgo

package mooncake

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/mooncaketest"
	"github.com/embcache/embcache/internal/workload"
)

// BenchmarkRealMooncakeGet reads 1, 8 and 100 MiB values from a real
// Mooncake Store whose segment another process holds (the cross-process
// get a reader on another node makes, over loopback TCP here), checksum
// verified, and, alternately, the same bytes over a bare TCP connection;
// x-bare-tcp is their ratio, reported as payload/shm's and
// payload/httppull's BenchmarkCrossProcessGet report theirs
// (workload.AgainstBareTCP). Needs a real store (make test-mooncake's, or
// MOONCAKE_DIR).
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
			want := value(size)
			loc, err := s.Put(ctx, o, want)
			if err != nil {
				b.Fatal(err)
			}
			var last []byte
			tGet, tTCP, rounds, err := workload.AgainstBareTCP(int(loc.Size), b.Loop, func() (time.Duration, error) {
				t0 := time.Now()
				got, err := s.Get(ctx, loc)
				if err != nil {
					return 0, err
				}
				d := time.Since(t0)
				last = append(last[:0], got.Tensor.Data...)
				return d, got.Close()
			})
			if err != nil {
				b.Fatal(err)
			}
			if !bytes.Equal(last, want.Tensor.Data) {
				b.Fatal("the bytes read back are not the ones put")
			}
			workload.ReportAgainstBareTCP(b, "get", int(loc.Size), rounds, tGet, tTCP)
		})
	}
}
