package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/cachekey"
)

// BenchmarkLookupHit: a hit of an 8 MiB value through the socket, from a Go
// client: the agent's share of a Python hit, without the interpreter.
func BenchmarkLookupHit(b *testing.B) {
	c, ref := committed8MiB(b)
	ctx := context.Background()
	var total time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := c.Lookup(ctx, ref, "bench"); err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
	}
	c.Release(ctx, "bench")
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "us/hit")
}

// BenchmarkStatsCall: the floor of a call through the socket (GET /v1/stats).
func BenchmarkStatsCall(b *testing.B) {
	n := startNode(b, startServer(b).ClientURL(), "n1")
	c := client(b, n)
	ctx := context.Background()
	for b.Loop() {
		if _, err := c.Stats(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLookupHitCold: as BenchmarkLookupHit, with 8 MiB copied between
// hits (what a serving process does between them evicts the caches).
func BenchmarkLookupHitCold(b *testing.B) {
	c, ref := committed8MiB(b)
	ctx := context.Background()
	src, dst := make([]byte, 8<<20), make([]byte, 8<<20)
	var hits, stats []time.Duration
	for b.Loop() {
		copy(dst, src)
		t0 := time.Now()
		if _, err := c.Lookup(ctx, ref, "bench"); err != nil {
			b.Fatal(err)
		}
		hits = append(hits, time.Since(t0))
		copy(dst, src)
		t0 = time.Now()
		if _, err := c.Stats(ctx); err != nil {
			b.Fatal(err)
		}
		stats = append(stats, time.Since(t0))
	}
	c.Release(ctx, "bench")
	slices.Sort(hits)
	slices.Sort(stats)
	b.ReportMetric(float64(hits[len(hits)/2].Microseconds()), "us-hit-p50")
	b.ReportMetric(float64(stats[len(stats)/2].Microseconds()), "us-stats-p50")
}

// committed8MiB is an agent holding one committed 8 MiB value, and a client.
func committed8MiB(b *testing.B) (*agent.Client, agent.KeyRef) {
	n := startNode(b, startServer(b).ClientURL(), "n1")
	c := client(b, n)
	ctx := context.Background()
	ref := keyOf(b, c, "bench-hit")
	resp, err := c.Lookup(ctx, ref, "warm")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Commit(ctx, resp.Reservation, "warm", "uint8", []int64{8 << 20}, make([]byte, 8<<20)); err != nil {
		b.Fatal(err)
	}
	return c, ref
}

// BenchmarkKeyBytes: the key of an input sent as it is (POST
// /v1/key/bytes) from a Go client, against keying the same bytes in memory
// (the floor: one BLAKE3 pass), alternated in the same run.
func BenchmarkKeyBytes(b *testing.B) {
	n := startNode(b, startServer(b).ClientURL(), "n1")
	c := client(b, n)
	ctx := context.Background()
	var cfg cachekey.PreprocessingConfig
	if err := json.Unmarshal(testConfig(), &cfg); err != nil {
		b.Fatal(err)
	}
	keyer, err := cachekey.NewKeyer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{200 << 10, 2 << 20, 8 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			data := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7, 8}, size/8)
			var sent, floor []time.Duration
			for b.Loop() {
				t0 := time.Now()
				got, err := c.KeyBytes(ctx, testConfig(), "raw-bytes", "", nil, bytes.NewReader(data))
				sent = append(sent, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				t0 = time.Now()
				want, _ := keyer.RawBytes(data)
				floor = append(floor, time.Since(t0))
				if got.Key != want.String() {
					b.Fatalf("key %s, want %s", got.Key, want)
				}
			}
			slices.Sort(sent)
			slices.Sort(floor)
			p50 := func(d []time.Duration) float64 { return float64(d[len(d)/2].Microseconds()) }
			b.ReportMetric(p50(sent), "us-sent-p50")
			b.ReportMetric(p50(floor), "us-floor-p50")
			b.ReportMetric(p50(sent)/p50(floor), "x-floor")
		})
	}
}
