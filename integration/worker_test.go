package integration

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
	"github.com/zeebo/blake3"
)

// Worker modes, chosen by EMBCACHE_WORKER.
const (
	modeBurst  = "burst"  // G goroutines get-or-compute keys 0..K-1; prints one result line per key
	modeHold   = "hold"   // reserve key 0 through GetOrCompute; fn blocks until stdin says "finish"
	modeGet    = "get"    // get-or-compute key 0 once; print the result line
	modeFault  = "fault"  // the fault-injection workload: a history on stdout (faults_test.go)
	modeServer = "server" // an embedded NATS server on EMBCACHE_STORE and EMBCACHE_PORT; prints "ready", runs until killed
)

// result is what a worker prints per key, one JSON object a line.
type result struct {
	Key     int                `json:"key"`
	Sum     string             `json:"sum"` // BLAKE3 of the value's data
	Path    string             `json:"path"`
	Err     string             `json:"err,omitempty"`
	Seconds float64            `json:"seconds"`
	Stats   *coordinator.Stats `json:"stats,omitempty"`
}

func workerRef(k int) coordinator.Ref {
	var key cachekey.Key
	binary.LittleEndian.PutUint64(key[:], uint64(k)+1000)
	return coordinator.Ref{Tenant: "itest", Key: key, Model: "m"}
}

// encode is the deterministic stand-in encoder: key k always gives the
// same 256 KiB. zombie gives other bytes, so a test can see whose value
// the cluster serves.
func encode(k int, zombie bool) *payload.Value {
	data := make([]byte, 256<<10)
	seed := uint32(k*2654435761 + 1)
	if zombie {
		seed ^= 0xdeadbeef
	}
	for i := 0; i < len(data); i += 4 {
		seed = seed*1664525 + 1013904223
		binary.LittleEndian.PutUint32(data[i:], seed)
	}
	return payload.NewTensor(cachekey.Float32, []int64{int64(len(data) / 4)}, data)
}

func sum(v *payload.Value) string {
	s := blake3.Sum256(v.Tensor.Data)
	return fmt.Sprintf("%x", s[:8])
}

// runWorker is main() of a worker process. It reports computes by
// appending "<key>\n" to EMBCACHE_COMPUTES (O_APPEND: atomic per line).
func runWorker(mode string) int {
	switch mode {
	case modeFault:
		return runFaultWorker()
	case modeServer:
		return runServer()
	}
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		out.Encode(result{Key: -1, Err: err.Error()})
		return 1
	}
	leaseTTL, _ := time.ParseDuration(os.Getenv("EMBCACHE_LEASE_TTL"))
	n, err := node.New(node.Options{NATSURL: os.Getenv("EMBCACHE_NATS"), Name: "itest-node", ShmDir: os.Getenv("EMBCACHE_SHM"),
		Strict: true, LeaseTTL: leaseTTL, NoEvents: true, Cache: []coordinator.Option{coordinator.WithComputeTimeout(2 * time.Minute)}})
	if err != nil {
		return fail(err)
	}
	if err := n.Start(context.Background()); err != nil {
		return fail(err)
	}
	defer n.Close()
	c := n.Cache()
	computes, err := os.OpenFile(os.Getenv("EMBCACHE_COMPUTES"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fail(err)
	}
	defer computes.Close()
	record := func(k int) { fmt.Fprintf(computes, "%d\n", k) }
	stdin := bufio.NewScanner(os.Stdin)
	ctx := context.Background()

	switch mode {
	case modeBurst:
		keys, _ := strconv.Atoi(os.Getenv("EMBCACHE_KEYS"))
		goroutines, _ := strconv.Atoi(os.Getenv("EMBCACHE_GOROUTINES"))
		out.Encode(result{Key: -1, Path: "ready"})
		stdin.Scan() // the start barrier: every worker begins together
		var mu sync.Mutex
		sums := make(map[int]string)
		var wg sync.WaitGroup
		errs := make(chan error, goroutines)
		for g := range goroutines {
			wg.Go(func() {
				for i := range keys {
					k := (i + g*7) % keys
					req := fmt.Sprintf("g%d-k%d", g, k)
					v, err := c.GetOrCompute(ctx, req, workerRef(k), func(context.Context) (*payload.Value, error) {
						record(k)
						return encode(k, false), nil
					})
					if err != nil {
						errs <- fmt.Errorf("key %d: %w", k, err)
						return
					}
					s := sum(v)
					c.Release(req)
					mu.Lock()
					if prev, ok := sums[k]; ok && prev != s {
						errs <- fmt.Errorf("key %d: two different values in one process", k)
					}
					sums[k] = s
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			return fail(err)
		}
		for k := range keys {
			out.Encode(result{Key: k, Sum: sums[k]})
		}
		st := c.Stats()
		out.Encode(result{Key: -1, Path: "stats", Stats: &st})
		return 0

	case modeHold:
		start := time.Now()
		v, path, err := c.GetOrComputePath(ctx, "hold", workerRef(0), func(context.Context) (*payload.Value, error) {
			record(0)
			out.Encode(result{Key: 0, Path: "computing"})
			stdin.Scan() // until "finish" (or stdin closes)
			return encode(0, true), nil
		})
		r := result{Key: 0, Path: path.String(), Seconds: time.Since(start).Seconds()}
		if err != nil {
			r.Err = err.Error()
		} else {
			r.Sum = sum(v)
		}
		st := c.Stats()
		r.Stats = &st
		out.Encode(r)
		return 0

	case modeGet:
		start := time.Now()
		v, path, err := c.GetOrComputePath(ctx, "get", workerRef(0), func(context.Context) (*payload.Value, error) {
			record(0)
			return encode(0, false), nil
		})
		r := result{Key: 0, Path: path.String(), Seconds: time.Since(start).Seconds()}
		if err != nil {
			r.Err = err.Error()
		} else {
			r.Sum = sum(v)
		}
		out.Encode(r)
		return 0
	}
	return fail(fmt.Errorf("unknown worker mode %q", mode))
}

// runServer is main() of a server process: a test kills it (SIGKILL) to
// stop the server uncleanly.
func runServer() int {
	port, err := strconv.Atoi(os.Getenv("EMBCACHE_PORT"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "EMBCACHE_PORT:", err)
		return 1
	}
	srv, err := embedded.Start(embedded.Options{StoreDir: os.Getenv("EMBCACHE_STORE"), Port: port})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Shutdown()
	fmt.Println("ready")
	select {}
}
