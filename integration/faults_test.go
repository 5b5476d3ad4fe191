package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The fault-injection harness: each schedule starts a 3-node cluster (R3
// bucket) whose routes run through proxies that can cut a node off, and
// fault workers (this test binary re-executed) that get-or-compute keys
// and write their history; a seeded schedule of faults hits them: SIGKILL
// of a worker, SIGSTOP past its lease, stop and restart of a NATS node
// (the stream leader included), a partition of one node. A checker then
// proves from the histories: (a) no key has two accepted commits, (b) every
// served value is bit-identical to the key's true value, (c) every
// accepted commit is still in the store, (d) forwards per key <= 1 + the
// faults that hit a compute of that key.
//
// go test ./integration -run TestFaults -faults.schedules 200 (make test-faults);
// make test runs a bounded number. -faults.seed N replays one schedule.
var (
	faultSchedules = flag.Int("faults.schedules", 0, "fault schedules to run (0: EMBCACHE_FAULT_SCHEDULES or 20)")
	faultSeed      = flag.Uint64("faults.seed", 0, "run only the schedule with this seed")
)

// hist is one history line of a fault worker.
type hist struct {
	T    int64  `json:"t"`    // unix nanos
	W    string `json:"w"`    // worker
	Ev   string `json:"ev"`   // compute-start, compute-end, served, error, reserved, committed, refused
	Key  int    `json:"key"`  // -1 for worker-wide lines
	Rev  uint64 `json:"rev"`  // fencing token, for lease events
	OK   bool   `json:"ok"`   // served: bit-identical to the true value
	Note string `json:"note"` // error text
}

type histWriter struct {
	mu  sync.Mutex
	enc *json.Encoder
	w   string
}

func (h *histWriter) emit(ev string, key int, rev uint64, ok bool, note string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.enc.Encode(hist{T: time.Now().UnixNano(), W: h.w, Ev: ev, Key: key, Rev: rev, OK: ok, Note: note})
}

func keyOf(r coordinator.Ref) int {
	n := 0
	for i := 7; i >= 0; i-- {
		n = n<<8 | int(r.Key[i])
	}
	return n - 1000
}

func (h *histWriter) Reserved(r coordinator.Ref, rev uint64) {
	h.emit("reserved", keyOf(r), rev, true, "")
}
func (h *histWriter) Committed(r coordinator.Ref, rev uint64, _ payload.Checksum) {
	h.emit("committed", keyOf(r), rev, true, "")
}
func (h *histWriter) Refused(r coordinator.Ref, rev uint64, err error) {
	h.emit("refused", keyOf(r), rev, false, err.Error())
}

// runFaultWorker runs EMBCACHE_OPS get-or-computes over EMBCACHE_KEYS keys.
func runFaultWorker() int {
	h := &histWriter{enc: json.NewEncoder(os.Stdout), w: os.Getenv("EMBCACHE_WORKER_NAME")}
	keys, _ := strconv.Atoi(os.Getenv("EMBCACHE_KEYS"))
	ops, _ := strconv.Atoi(os.Getenv("EMBCACHE_OPS"))
	seed, _ := strconv.ParseUint(os.Getenv("EMBCACHE_SEED"), 10, 64)
	store, err := shm.Open(os.Getenv("EMBCACHE_SHM"), shm.WithNode("itest-node"))
	if err != nil {
		h.emit("error", -1, 0, false, err.Error())
		return 1
	}
	nc, err := nats.Connect(os.Getenv("EMBCACHE_NATS"), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		h.emit("error", -1, 0, false, err.Error())
		return 1
	}
	defer nc.Close()
	var c *coordinator.Cache
	for range 100 { // the cluster may be electing
		c, err = coordinator.New(context.Background(), nc, coordinator.WithMode(coordinator.ModeStrict),
			coordinator.WithReplicas(3), coordinator.WithTransport(payload.TransportShm, store), coordinator.WithShm(store),
			coordinator.WithNode("itest-node"), coordinator.WithLeaseTTL(time.Second), coordinator.WithOpTimeout(time.Second),
			coordinator.WithComputeTimeout(20*time.Second), coordinator.WithObserver(h))
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		h.emit("error", -1, 0, false, err.Error())
		return 1
	}
	defer c.Close()
	h.emit("ready", -1, 0, true, "")
	rng := rand.New(rand.NewPCG(seed, 11))
	for i := range ops {
		k := rng.IntN(keys)
		req := fmt.Sprint("op-", i)
		v, err := c.GetOrCompute(context.Background(), req, workerRef(k), func(context.Context) (*payload.Value, error) {
			h.emit("compute-start", k, 0, true, "")
			time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond) // the encoder's time on the GPU
			v := encode(k, false)
			h.emit("compute-end", k, 0, true, "")
			return v, nil
		})
		if err != nil {
			h.emit("error", k, 0, false, err.Error())
			time.Sleep(50 * time.Millisecond)
			continue
		}
		h.emit("served", k, 0, sum(v) == sum(encode(k, false)), "")
		c.Release(req)
	}
	h.emit("done", -1, 0, true, "")
	return 0
}

type faultStats struct {
	schedules, keys, served, errors, violations int
	faults                                      map[string]int
}

func TestFaults(t *testing.T) {
	n := *faultSchedules
	if n == 0 {
		n, _ = strconv.Atoi(os.Getenv("EMBCACHE_FAULT_SCHEDULES"))
	}
	if n == 0 {
		n = 20
	}
	if testing.Short() {
		t.Skip("fault schedules take seconds each")
	}
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	if *faultSeed != 0 {
		seeds = []uint64{*faultSeed}
	}
	total := faultStats{faults: map[string]int{}}
	for _, seed := range seeds {
		st := runSchedule(t, seed)
		total.schedules++
		total.keys += st.keys
		total.served += st.served
		total.errors += st.errors
		total.violations += st.violations
		for k, v := range st.faults {
			total.faults[k] += v
		}
		if t.Failed() {
			t.Fatalf("schedule %d failed: replay it with go test ./integration -run TestFaults -faults.seed %d", seed, seed)
		}
	}
	kinds := make([]string, 0, len(total.faults))
	for k, v := range total.faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, v))
	}
	slices.Sort(kinds)
	msg := fmt.Sprintf("fault schedules: %d, faults: %s, keys: %d, values served: %d, errors retried: %d, violations: %d",
		total.schedules, strings.Join(kinds, " "), total.keys, total.served, total.errors, total.violations)
	t.Log(msg)
	fmt.Println(msg)
}

// faultProc is one fault worker process and its history.
type faultProc struct {
	name  string
	cmd   *exec.Cmd
	lines []hist
	mu    sync.Mutex
	done  chan struct{}
}

func runSchedule(t *testing.T, seed uint64) faultStats {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 99))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	var proxies []*proxy
	byNode := map[int][]*proxy{} // proxies on the links of a node
	cl, err := embedded.StartCluster(ctx, 3, dir, func(i int, o *embedded.Options) {
		routes := []string{}
		for j, r := range o.Routes {
			if j == i {
				continue
			}
			p, err := newProxy(strings.TrimPrefix(r, "nats-route://"))
			if err != nil {
				t.Fatal(err)
			}
			proxies = append(proxies, p)
			byNode[i] = append(byNode[i], p)
			byNode[j] = append(byNode[j], p)
			routes = append(routes, "nats-route://"+p.addr())
		}
		o.Routes = routes
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cl.Shutdown()
		for _, p := range proxies {
			p.close()
		}
	}()
	shmDir, err := os.MkdirTemp("/dev/shm", "embcache-faults-")
	if err != nil {
		shmDir = t.TempDir()
	} else {
		defer os.RemoveAll(shmDir)
	}
	const workers, keys, ops = 3, 10, 25
	start := func(name string, wseed uint64) *faultProc {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "EMBCACHE_WORKER="+modeFault, "EMBCACHE_WORKER_NAME="+name,
			"EMBCACHE_NATS="+cl.ClientURLs(), "EMBCACHE_SHM="+shmDir, "EMBCACHE_KEYS="+strconv.Itoa(keys),
			"EMBCACHE_OPS="+strconv.Itoa(ops), "EMBCACHE_SEED="+strconv.FormatUint(wseed, 10))
		stdout, _ := cmd.StdoutPipe()
		p := &faultProc{name: name, cmd: cmd, done: make(chan struct{})}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer close(p.done)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var h hist
				if json.Unmarshal(sc.Bytes(), &h) == nil {
					p.mu.Lock()
					p.lines = append(p.lines, h)
					p.mu.Unlock()
				}
			}
			cmd.Wait()
		}()
		return p
	}
	var procs []*faultProc
	for w := range workers {
		procs = append(procs, start(fmt.Sprint("w", w), seed*100+uint64(w)))
	}

	// The schedule: two faults, at seeded times in the first ~2 s.
	st := faultStats{faults: map[string]int{}}
	type window struct{ from, to int64 }
	var faultTimes []window
	for f := range 2 {
		time.Sleep(time.Duration(300+rng.IntN(900)) * time.Millisecond) // the schedule's clock
		from := time.Now().UnixNano()
		switch kind := rng.IntN(4); kind {
		case 0: // SIGKILL a worker, start a replacement
			i := rng.IntN(len(procs))
			procs[i].cmd.Process.Signal(syscall.SIGKILL)
			<-procs[i].done
			procs = append(procs, start(fmt.Sprintf("w%d-r%d", i, f), seed*100+uint64(10+f)))
			st.faults["kill-worker"]++
		case 1: // SIGSTOP a worker past its lease
			i := rng.IntN(len(procs))
			procs[i].cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(1500 * time.Millisecond)
			procs[i].cmd.Process.Signal(syscall.SIGCONT)
			st.faults["pause-worker"]++
		case 2: // stop a NATS node (half the time the stream leader), restart it
			node := cl.Nodes[rng.IntN(3)]
			if rng.IntN(2) == 0 {
				nc, err := cl.Connect()
				if err == nil {
					if js, err := jetstreamOf(nc); err == nil {
						if l, err := cl.StreamLeader(ctx, js, "KV_"+coordinator.DefaultBucket); err == nil {
							node = l
						}
					}
					nc.Close()
				}
			}
			node.Shutdown()
			time.Sleep(time.Duration(500+rng.IntN(1000)) * time.Millisecond)
			var err error
			for range 3 { // its port may be briefly taken; the store is what matters
				if err = node.Restart(); err == nil {
					break
				}
			}
			if err != nil {
				t.Fatalf("seed %d: restart %s: %v", seed, node.Name(), err)
			}
			st.faults["stop-node"]++
		case 3: // partition one node from the others
			k := rng.IntN(3)
			for _, p := range byNode[k] {
				p.setCut(true)
			}
			time.Sleep(time.Duration(500+rng.IntN(1000)) * time.Millisecond)
			for _, p := range byNode[k] {
				p.setCut(false)
			}
			st.faults["partition-node"]++
		}
		// A fault's reach outlasts it: elections and reconnects settle after it.
		faultTimes = append(faultTimes, window{from, time.Now().Add(3 * time.Second).UnixNano()})
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-ctx.Done():
			p.cmd.Process.Kill()
			<-p.done
			t.Errorf("seed %d: worker %s did not finish", seed, p.name)
		}
	}

	// The checker.
	var all []hist
	for _, p := range procs {
		all = append(all, p.lines...)
	}
	slices.SortFunc(all, func(a, b hist) int { return int(a.T - b.T) })
	violate := func(format string, args ...any) {
		st.violations++
		t.Errorf("seed %d: "+format, append([]any{seed}, args...)...)
	}
	commits := map[int][]hist{}
	computes := map[int]int{}
	open := map[string]int64{} // worker/key -> compute start
	touched := map[int]int{}   // faults that hit a compute of the key
	hitKey := map[int]map[int]bool{}
	for _, h := range all {
		switch h.Ev {
		case "committed":
			commits[h.Key] = append(commits[h.Key], h)
		case "compute-start":
			computes[h.Key]++
			open[fmt.Sprint(h.W, "/", h.Key)] = h.T
		case "compute-end":
			delete(open, fmt.Sprint(h.W, "/", h.Key))
		case "served":
			st.served++
			if !h.OK {
				violate("worker %s served key %d with the wrong bytes", h.W, h.Key) // (b)
			}
		case "error":
			st.errors++
		}
	}
	// A compute is hit by a fault that overlaps it, or that begins before
	// its commit could land (a compute left open: its worker died).
	for _, h := range all {
		if h.Ev != "compute-start" {
			continue
		}
		end := int64(1 << 62)
		for _, e := range all {
			if e.W == h.W && e.Key == h.Key && e.Ev == "compute-end" && e.T >= h.T {
				end = e.T + int64(3*time.Second)
				break
			}
		}
		for fi, f := range faultTimes {
			if f.from <= end && f.to >= h.T {
				if hitKey[h.Key] == nil {
					hitKey[h.Key] = map[int]bool{}
				}
				hitKey[h.Key][fi] = true
			}
		}
	}
	for k, fs := range hitKey {
		touched[k] = len(fs)
	}
	for k, cs := range commits {
		if len(cs) > 1 {
			violate("key %d has %d accepted commits", k, len(cs)) // (a)
		}
	}
	for k, n := range computes {
		if n > 1+touched[k] {
			violate("key %d computed %d times with %d faults touching it", k, n, touched[k]) // (d)
		}
	}
	// (c): every accepted commit is still the key's record.
	nc, err := cl.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := cl.WaitJetStream(ctx); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	var check *coordinator.Cache
	for attempt := 0; ; attempt++ { // the bucket's own leader may still be electing
		check, err = coordinator.New(ctx, nc, coordinator.WithMode(coordinator.ModeStrict), coordinator.WithReplicas(3),
			coordinator.WithTransport(payload.TransportShm, mustShm(t, shmDir)), coordinator.WithNode("itest-node"))
		if err == nil {
			break
		}
		if attempt == 100 {
			t.Fatalf("seed %d: %v", seed, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer check.Close()
	for k, cs := range commits {
		var v *payload.Value
		var path coordinator.Path
		for attempt := 0; attempt < 50; attempt++ { // the cluster may still be electing
			v, path, err = check.GetOrComputePath(ctx, "check", workerRef(k), func(context.Context) (*payload.Value, error) {
				return nil, fmt.Errorf("key %d recomputed: its commit (rev %d) was lost", k, cs[0].Rev)
			})
			if err == nil || strings.Contains(err.Error(), "recomputed") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil || path != coordinator.PathRemoteHit || sum(v) != sum(encode(k, false)) {
			violate("key %d: committed value not served from the store: %v %v", k, path, err)
		}
		check.Release("check")
	}
	st.keys = len(computes)
	return st
}

func mustShm(t *testing.T, dir string) *shm.Store {
	s, err := shm.Open(dir, shm.WithNode("itest-node"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func jetstreamOf(nc *nats.Conn) (jetstream.JetStream, error) { return jetstream.New(nc) }
