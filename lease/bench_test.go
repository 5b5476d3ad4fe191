package lease

import (
	"context"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/natstest"
)

// BenchmarkTombstoneReads: 16 goroutines of one process check one
// tombstone at once, as the remote hits of a busy agent do. Shared, a
// caller is answered by a read sent after it asked; the baseline is a
// read of its own each. reads/op counts the requests sent; x-baseline is
// the shared reads' time per check over the baseline's.
func BenchmarkTombstoneReads(b *testing.B) {
	nc := natstest.Conn(b)
	bk, err := OpenBucket(context.Background(), nc, BucketConfig{Name: DefaultBucket, MarkerTTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	key := TombstoneKey("acme", "m", 1)
	own := func(ctx context.Context) error { _, err := bk.readIn(ctx, 0, key); return err }
	shared := func(ctx context.Context) error { _, err := bk.Tombstone(ctx, 0, "acme", "m", 1); return err }
	run := func(b *testing.B, check func(context.Context) error) (perOp time.Duration) {
		b.SetParallelism(8) // x GOMAXPROCS (2): 16 goroutines
		sent := nc.Stats().OutMsgs
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := check(context.Background()); err != nil {
					b.Error(err)
					return
				}
			}
		})
		perOp = time.Since(start) / time.Duration(b.N)
		b.ReportMetric(float64(nc.Stats().OutMsgs-sent)/float64(b.N), "reads/op")
		return perOp
	}
	var base time.Duration
	b.Run("own", func(b *testing.B) { base = run(b, own) })
	b.Run("shared", func(b *testing.B) {
		d := run(b, shared)
		if base > 0 {
			b.ReportMetric(float64(d)/float64(base), "x-baseline")
		}
	})
}
