package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/zeebo/blake3"
)

// The hot-path suites keys, local and payload (coord is in coord.go), each
// case timed alternately with its floor.

// benchRow is one measurement: ours against its baseline, in the same run.
type benchRow struct {
	Suite    string  `json:"suite"`
	Case     string  `json:"case"`
	Ours     float64 `json:"ours"`
	Baseline float64 `json:"baseline"`
	Unit     string  `json:"unit"`
	Ratio    float64 `json:"ratio"` // ours / baseline (for throughputs: baseline / ours), lower is better
	Note     string  `json:"note,omitempty"`
}

// alternate times ours and base alternately for rounds, returning medians.
func alternate(rounds int, ours, base func() error) (time.Duration, time.Duration, error) {
	var a, b []time.Duration
	for range rounds {
		t0 := time.Now()
		if err := ours(); err != nil {
			return 0, 0, err
		}
		t1 := time.Now()
		if err := base(); err != nil {
			return 0, 0, err
		}
		b = append(b, time.Since(t1))
		a = append(a, t1.Sub(t0))
	}
	return medianDuration(a), medianDuration(b), nil
}

func medianDuration(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func gbps(bytes int, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e9 }

func benchKeys(quick bool) ([]benchRow, error) {
	keyer, err := cachekey.NewKeyer(workload.Config("bench"))
	if err != nil {
		return nil, err
	}
	sizes, rounds := []int{200 << 10, 2 << 20, 8 << 20}, 40
	if quick {
		sizes, rounds = []int{64 << 10}, 3
	}
	var rows []benchRow
	for _, size := range sizes {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(i * 131)
		}
		name := fmt.Sprintf("%d KiB", size>>10)
		ours, bare, err := alternate(rounds, func() error { _, err := keyer.RawBytes(data); return err },
			func() error { blake3.Sum256(data); return nil })
		if err != nil {
			return nil, err
		}
		rows = append(rows, benchRow{"keys", "key vs BLAKE3 " + name, gbps(size, ours), gbps(size, bare), "GB/s",
			float64(ours) / float64(bare), fmt.Sprintf("%.0f us per key", float64(ours.Microseconds()))})
		_, sha, _ := alternate(rounds, func() error { return nil }, func() error { sha256.Sum256(data); return nil })
		rows = append(rows, benchRow{"keys", "key vs SHA-256 " + name, gbps(size, ours), gbps(size, sha), "GB/s",
			float64(ours) / float64(sha), "SHA-256 for reference"})
	}
	return rows, nil
}

type benchBlob []byte

func (b benchBlob) Size() int64 { return int64(len(b)) }

func benchLocal(quick bool) ([]benchRow, error) {
	const keys = 1024
	n := 500_000
	if quick {
		n = 5_000
	}
	var rows []benchRow
	for _, goroutines := range []int{1, 2} {
		c, err := localcache.New(localcache.Options[int, benchBlob]{Budget: localcache.Budget{MaxEntries: keys}})
		if err != nil {
			return nil, err
		}
		bare, _ := lru.New[int, benchBlob](keys)
		for k := range keys {
			c.Put("", k, benchBlob("v"))
			bare.Add(k, benchBlob("v"))
		}
		run := func(op func(w, i int)) time.Duration {
			var wg sync.WaitGroup
			start := time.Now()
			for w := range goroutines {
				wg.Go(func() {
					for i := range n / goroutines {
						op(w, i)
					}
				})
			}
			wg.Wait()
			return time.Since(start)
		}
		reqs := []string{"r0", "r1"}
		ours := run(func(w, i int) {
			c.Get(reqs[w], (i*7+w)%keys)
			if i%4 == 3 {
				c.Release(reqs[w])
			}
		})
		base := run(func(w, i int) { bare.Get((i*7 + w) % keys) })
		rate := func(d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }
		rows = append(rows, benchRow{"local", fmt.Sprintf("hit, %d goroutine(s)", goroutines), rate(ours), rate(base),
			"M hits/s", float64(ours) / float64(base), "Get pins; a Release every 4 hits; baseline: golang-lru Get"})
		// Each hit timed on its own (the clock reads cost the same on both sides).
		lat := make([][]time.Duration, 2*goroutines)
		timed := func(side int, op func(w, i int)) {
			run(func(w, i int) {
				t0 := time.Now()
				op(w, i)
				lat[side*goroutines+w] = append(lat[side*goroutines+w], time.Since(t0))
			})
		}
		timed(0, func(w, i int) {
			c.Get(reqs[w], (i*7+w)%keys)
			if i%4 == 3 {
				c.Release(reqs[w])
			}
		})
		timed(1, func(w, i int) { bare.Get((i*7 + w) % keys) })
		pct := func(side int, q float64) time.Duration {
			var all []time.Duration
			for _, l := range lat[side*goroutines : (side+1)*goroutines] {
				all = append(all, l...)
			}
			slices.Sort(all)
			return all[min(len(all)-1, int(float64(len(all))*q))]
		}
		for _, q := range []float64{0.50, 0.99} {
			o, b := pct(0, q), pct(1, q)
			rows = append(rows, benchRow{"local", fmt.Sprintf("hit p%.0f, %d goroutine(s)", q*100, goroutines),
				float64(o.Nanoseconds()), float64(b.Nanoseconds()), "ns", float64(o) / float64(max(b, 1)), "each hit timed"})
		}
	}
	return rows, nil
}

func benchPayload(quick bool) ([]benchRow, error) {
	sizes, rounds := []int{8 << 20, 100 << 20}, 10
	if quick {
		sizes, rounds = []int{1 << 20}, 3
	}
	dir, err := os.MkdirTemp("/dev/shm", "embcache-bench-")
	if err != nil {
		dir, err = os.MkdirTemp("", "embcache-bench-")
		if err != nil {
			return nil, err
		}
	}
	defer os.RemoveAll(dir)
	store, err := shm.Open(dir, shm.WithNode("bench"))
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h, err := httppull.NewServer(store)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	defer srv.Close()
	tr, err := httppull.NewTransport("bench", "http://"+l.Addr().String(), store)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	var rows []benchRow
	for i, size := range sizes {
		v := payload.NewTensor(cachekey.Uint8, []int64{int64(size)}, make([]byte, size))
		obj := payload.ObjectID{Tenant: "bench", Key: cachekey.Key{byte(i + 1)}}
		loc, err := tr.Put(ctx, obj, v)
		if err != nil {
			return nil, err
		}
		shmLoc := loc
		shmLoc.Transport, shmLoc.Address = payload.TransportShm, store.Dir()
		dst := make([]byte, loc.Size)
		name := fmt.Sprintf("%d MiB", size>>20)
		ours, base, err := alternate(rounds, func() error {
			got, err := store.Get(ctx, shmLoc)
			if err == nil {
				got.Close()
			}
			return err
		}, func() error { copy(dst, v.Tensor.Data); return nil })
		if err != nil {
			return nil, err
		}
		rows = append(rows, benchRow{"payload", "shm get " + name, float64(ours.Microseconds()), float64(base.Microseconds()),
			"us", float64(ours) / float64(base), "maps, does not copy; baseline: memcpy"})
		hits, err := benchShmHits(ctx, store.Dir(), shmLoc, rounds)
		if err != nil {
			return nil, err
		}
		rows = append(rows, hits...)
		tcpAddr, stop, err := workload.BareTCPServer(make([]byte, loc.Size))
		if err != nil {
			return nil, err
		}
		ours, base, err = alternate(rounds, func() error {
			got, err := tr.Get(ctx, loc)
			if err == nil {
				got.Close()
			}
			return err
		}, func() error { return workload.ReadBareTCP(tcpAddr, dst) })
		stop()
		if err != nil {
			return nil, err
		}
		rows = append(rows, benchRow{"payload", "httppull get " + name, gbps(size, ours), gbps(size, base), "GB/s",
			float64(ours) / float64(base), "checksum verified; baseline: bare loopback TCP"})
	}
	return rows, nil
}

// benchShmHits: a same-node hit of a value another process wrote, by a
// store of its own (what another process of the node has: nothing but the
// directory is shared), against a store that checks the trailer only,
// alternated. "first hit" is a store's first Get of the file (it trusts
// the writer's proof), "later hit" a Get after its mapping went, "node's
// first verification" a first Get with no proof on the node (it hashes).
func benchShmHits(ctx context.Context, dir string, loc payload.Location, rounds int) ([]benchRow, error) {
	obj, err := loc.ObjectID()
	if err != nil {
		return nil, err
	}
	stores := func(opts ...shm.Option) ([]*shm.Store, error) {
		ss := make([]*shm.Store, rounds)
		for i := range ss {
			if ss[i], err = shm.Open(dir, opts...); err != nil {
				return nil, err
			}
		}
		return ss, nil
	}
	get := func(s *shm.Store) error {
		v, err := s.Get(ctx, loc)
		if err != nil {
			return err
		}
		_ = v.Tensor.Data[len(v.Tensor.Data)-1] // touch the mapping
		return v.Close()
	}
	proof := filepath.Join(dir, ".proofs", obj.Tenant, obj.Key.String()) // docs/protocol.md 2.3
	name := fmt.Sprintf("%d MiB", loc.Size>>20)
	var rows []benchRow
	for _, c := range []struct {
		what  string
		fresh bool // a new store each round
		drop  bool // no proof on the node
	}{{"first hit", true, false}, {"later hit", false, false}, {"node's first verification", true, true}} {
		ours, err := stores()
		if err != nil {
			return nil, err
		}
		base, err := stores(shm.WithVerifyData(false))
		if err != nil {
			return nil, err
		}
		i, j := 0, 0
		tOurs, tBase, err := alternate(rounds, func() error {
			if c.drop {
				if err := os.Remove(proof); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
			}
			s := ours[0]
			if c.fresh {
				s, i = ours[i], i+1
			}
			return get(s)
		}, func() error {
			s := base[0]
			if c.fresh {
				s, j = base[j], j+1
			}
			return get(s)
		})
		if err != nil {
			return nil, err
		}
		rows = append(rows, benchRow{"payload", "shm " + c.what + " " + name, float64(tOurs.Microseconds()), float64(tBase.Microseconds()),
			"us", float64(tOurs) / float64(tBase), "another process's store; baseline: trailer-only map"})
	}
	return rows, nil
}
