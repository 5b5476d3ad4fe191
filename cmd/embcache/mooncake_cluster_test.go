//go:build mooncake && cgo

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/inspect"
	"github.com/embcache/embcache/internal/mooncaketest"
	"github.com/embcache/embcache/internal/syncbuf"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/zeebo/blake3"
)

// TestMooncakeCluster: three embcache nodes (three serve processes forming
// a NATS cluster, replicas 3), each with a worker that writes through a
// real Mooncake Store (no segment of its own), one mooncake_master, one
// process holding the store's segment (an agent of node 1).
//
//  1. Every input is computed once in the cluster and pulled by the other
//     two nodes through Mooncake (the master counts the reads), its
//     record's checksum the expected value's.
//  2. The holder is killed (SIGKILL): its objects go with it, new workers
//     compute every value themselves (the right bytes: their records are
//     gone or unreadable, nothing is pulled), saying why; a new holder,
//     and values are shared again.
//  3. The master is stopped: every request is answered by a compute of its
//     own, promptly (the library alone retries each call for seconds; the
//     transport fails its calls at once while the master is down), at the
//     outage's start and 6 s into it, in the default mode and in strict
//     mode alike (--strict is about NATS, which is up), and the logs name
//     the master. A worker started then exits promptly, naming it.
//  4. The master starts again on its ports: it has lost its objects, the
//     holder mounts its segment again by itself, the workers' stores
//     answer again, and values are shared through Mooncake again.
func TestMooncakeCluster(t *testing.T) {
	began := time.Now()
	c := startMooncakeCluster(t)
	t.Logf("cluster up in %v", time.Since(began).Round(time.Millisecond))

	// 1. Shared through Mooncake.
	holder := c.holder("holder1", 0)
	ws := c.workers()
	reads := c.masterMetric("master_get_replica_list_requests_total") - c.masterMetric("master_get_replica_list_failures_total")
	images := []int{1, 2, 3, 4, 5, 6}
	answers := askAll(t, ws, images)
	pulled := 0
	for _, img := range images {
		computed := 0
		for k := range ws {
			a := answers[k][img]
			switch {
			case a.Err != "":
				t.Fatalf("node %d, input %d: %s", k+1, img, a.Err)
			case a.Path == "computed":
				computed++
			case a.Path == "remote-hit" || a.Path == "waited":
				if a.Bytes != c.size {
					t.Fatalf("node %d, input %d: %s of %d bytes, want %d", k+1, img, a.Path, a.Bytes, c.size)
				}
				pulled++
			default:
				t.Fatalf("node %d, input %d: path %s, want computed once in the cluster and pulled elsewhere", k+1, img, a.Path)
			}
		}
		if computed != 1 {
			t.Fatalf("input %d computed %d times in the cluster, want once: %+v %+v %+v", img, computed,
				answers[0][img], answers[1][img], answers[2][img])
		}
		c.checkRecord(img)
	}
	if got := c.masterMetric("master_get_replica_list_requests_total") - c.masterMetric("master_get_replica_list_failures_total") - reads; got < float64(pulled) {
		t.Fatalf("the master served %v reads for %d values pulled: not through Mooncake", got, pulled)
	}
	computes := uint64(0)
	for k, w := range ws {
		s := w.stats(t)
		if s.PayloadErrors != 0 || s.Degraded != 0 || s.CommitsRefused != 0 {
			t.Fatalf("node %d's worker: %+v, want no payload error, nothing degraded, no commit refused", k+1, s)
		}
		computes += s.Computes
	}
	if computes != uint64(len(images)) {
		t.Fatalf("%d computes in the cluster for %d inputs", computes, len(images))
	}
	t.Logf("1. %d inputs computed once each, %d pulls through Mooncake (%v)", len(images), pulled, time.Since(began).Round(time.Millisecond))

	// 2. The holder killed: new workers (no local copies) find the
	// values gone and compute them; nothing is pulled.
	stopWorkers(t, ws)
	holder.Process.Kill()
	holder.Wait()
	ws = c.workers()
	killed := time.Now()
	answers = askAll(t, ws, images)
	slowest := 0.0
	for _, img := range images {
		for k := range ws {
			a := answers[k][img]
			if a.Err != "" || (a.Path != "computed" && a.Path != "degraded") {
				t.Fatalf("node %d, input %d after the holder died: %+v, want computed here", k+1, img, a)
			}
			slowest = max(slowest, a.Millis)
		}
	}
	// Read while the master still lists the dead holder's objects: the
	// transfer fails (-800); once it has dropped them, not found (-704).
	if said := embcacheLines(ws); !strings.Contains(said, "committed payload unreadable") ||
		!strings.Contains(said, "transfer failed") && !strings.Contains(said, "object not found") {
		t.Fatalf("the workers do not say why the values could not be read:\n%s", said)
	}
	t.Logf("2. holder killed: every request computed, slowest %.0f ms; the workers said:\n%s", slowest, embcacheLines(ws))
	c.holder("holder2", 1)
	shared := c.untilShared(ws, 100, 60*time.Second)
	t.Logf("2. a new holder: shared again %v after the kill (%v)", time.Since(killed).Round(time.Millisecond),
		time.Since(began).Round(time.Millisecond))

	// 3. The master stopped: every request is answered, by a compute of
	// its own, promptly, in both modes; a value committed before (shared)
	// cannot be read and is computed by the node that had not read it.
	// New inputs at once, and again once the outage has lasted longer
	// than one of the library's retried calls (about 4.3 s): the stores'
	// probes of the master have failed meanwhile.
	c.master.Stop()
	down := time.Now()
	slowest = 0
	for round, imgs := range [][]int{{shared}, {200, 201, 202}, {210, 211, 212}} {
		if round == 2 {
			time.Sleep(time.Until(down.Add(6 * time.Second))) // the outage's length, not an ordering
		}
		for k, w := range ws {
			start := time.Now()
			got := w.ask(t, imgs...)
			took := time.Since(start)
			for img, a := range got {
				if a.Err != "" || a.Path != "computed" && a.Path != "degraded" && a.Path != "local-hit" {
					t.Fatalf("node %d, input %d with the master down: %+v, want it answered", k+1, img, a)
				}
				slowest = max(slowest, a.Millis)
			}
			// A request: about the encoder's 100 ms, a fresh input's
			// waiting for the others' (one GPU).
			if took > 3*time.Second {
				t.Fatalf("node %d with the master down: %d requests answered in %v (%+v), want within 3 s", k+1, len(imgs), took, got)
			}
		}
	}
	for k, w := range ws {
		if log := w.log.String(); !strings.Contains(log, "master "+c.master.Addr+" unreachable") {
			t.Fatalf("node %d's worker does not name the master:\n%s", k+1, mooncaketest.Tail(log, 3000))
		}
	}
	t.Logf("3. master down: every request answered, slowest %.0f ms (%v down); the workers said:\n%s", slowest,
		time.Since(down).Round(time.Millisecond), embcacheLines(ws))
	// A worker that starts now cannot open the store: it says so, promptly
	// (setup alone retries for about 90 s).
	start := time.Now()
	out, err := exec.Command(c.bin, c.workerArgs(0)...).CombinedOutput()
	if took := time.Since(start); err == nil || took > 15*time.Second || !strings.Contains(string(out), "master "+c.master.Addr+" unreachable") {
		t.Fatalf("a worker started with the master down: %v after %v, want it to fail naming the master:\n%s", err, took,
			mooncaketest.Tail(string(out), 3000))
	} else {
		t.Logf("3. a worker started with the master down exits in %v: %s", took.Round(time.Millisecond), lastLine(string(out)))
	}

	// 4. The master back on its ports.
	c.master.Restart()
	back := time.Now()
	c.untilShared(ws, 300, 60*time.Second)
	t.Logf("4. master restarted: values shared again after %v", time.Since(back).Round(time.Millisecond))
	for k, w := range ws[:2] {
		if log := w.log.String(); !strings.Contains(log, "mooncake: master answers again") {
			t.Fatalf("node %d's worker shares again but did not say the master answers:\n%s", k+1, embcacheLines(ws))
		}
	}
	stopWorkers(t, ws)
	t.Logf("wall time %v", time.Since(began).Round(time.Millisecond))
}

// mooncakeCluster is three nodes' serve processes, a Mooncake master and
// what the test expects of the values.
type mooncakeCluster struct {
	t      *testing.T
	bin    string
	dir    string // the Mooncake install
	work   string
	master *mooncaketest.Master
	nats   [3]int // the serve processes' client ports
	keyer  *cachekey.Keyer
	size   int64 // a value's size (--embed-mb 1)
}

const clusterEmbedBytes = 1 << 20

func startMooncakeCluster(t *testing.T) *mooncakeCluster {
	t.Helper()
	c := &mooncakeCluster{t: t, dir: mooncaketest.Dir(t), work: t.TempDir()}
	var err error
	if c.keyer, err = cachekey.NewKeyer(workload.Config("demo")); err != nil {
		t.Fatal(err)
	}
	v, err := (&workload.Encoder{Bytes: clusterEmbedBytes}).Encode(context.Background(), workload.Image(1))
	if err != nil {
		t.Fatal(err)
	}
	c.size = v.Size() // what a worker says it pulled
	c.master = mooncaketest.StartMaster(t, c.dir)
	c.bin = filepath.Join(t.TempDir(), "embcache-mooncake")
	built := time.Now()
	if out, err := exec.Command("go", "build", "-tags", "mooncake", "-o", c.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags mooncake: %v\n%s", err, out)
	}
	t.Logf("built in %v", time.Since(built).Round(time.Millisecond))
	var routes []string
	cluster := [3]int{}
	for i := range 3 {
		c.nats[i], _ = embedded.FreePort("127.0.0.1")
		cluster[i], _ = embedded.FreePort("127.0.0.1")
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", cluster[i]))
	}
	serves := make([]*clusterProc, 3)
	for i := range 3 {
		node := fmt.Sprintf("n%d", i+1)
		serves[i] = c.start("serve-"+node, append([]string{"serve", "--server-name", node, "--port", strconv.Itoa(c.nats[i]),
			"--cluster-port", strconv.Itoa(cluster[i]), "--routes", strings.Join(routes, ","), "--replicas", "3",
			"--store-dir", filepath.Join(c.work, node, "js"), "--shm-dir", filepath.Join(c.work, node, "shm")},
			c.flags(node, 0)...)...)
	}
	for _, s := range serves {
		s.waitFor(t, "embcache serve: ready", 60*time.Second)
	}
	return c
}

// flags are the node and Mooncake flags of a process of node, which
// contributes segment bytes to the store.
func (c *mooncakeCluster) flags(node string, segment int) []string {
	return []string{"--node", node, "--payload", "mooncake", "--mooncake-master", c.master.Addr,
		"--mooncake-metadata", c.master.Metadata, "--mooncake-lib", mooncaketest.Library(c.dir),
		"--mooncake-hostname", "127.0.0.1", "--mooncake-segment-bytes", strconv.Itoa(segment)}
}

func (c *mooncakeCluster) natsURL(k int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.nats[k]) }

// clusterProc is a process of the test, its output kept.
type clusterProc struct {
	*exec.Cmd
	log *syncbuf.Buffer
}

// start runs the binary with args until the test ends.
func (c *mooncakeCluster) start(name string, args ...string) *clusterProc {
	c.t.Helper()
	p := &clusterProc{Cmd: exec.Command(c.bin, args...), log: &syncbuf.Buffer{}}
	p.Stdout, p.Stderr = p.log, p.log
	if err := p.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() {
		if p.ProcessState == nil {
			p.Process.Kill()
			p.Wait()
		}
		if c.t.Failed() {
			c.t.Logf("%s's output:\n%s", name, mooncaketest.Tail(p.log.String(), 3000))
		}
	})
	return p
}

// waitFor polls p's output until it holds want.
func (p *clusterProc) waitFor(t *testing.T, want string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); !strings.Contains(p.log.String(), want); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q within %v:\n%s", want, within, mooncaketest.Tail(p.log.String(), 3000))
		}
	}
}

// holder starts an agent of node k+1 that holds a 64 MiB segment of the
// store, and waits until the master counts it.
func (c *mooncakeCluster) holder(name string, k int) *clusterProc {
	c.t.Helper()
	capacity := c.masterMetric("master_total_capacity_bytes")
	p := c.start(name, append([]string{"agent", "--nats", c.natsURL(k), "--socket", filepath.Join(c.work, name, "agent.sock"),
		"--shm-dir", filepath.Join(c.work, name, "shm")}, c.flags(fmt.Sprintf("n%d", k+1), 64<<20)...)...)
	for deadline := time.Now().Add(30 * time.Second); c.masterMetric("master_total_capacity_bytes") < capacity+64<<20; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) || p.ProcessState != nil {
			c.t.Fatalf("%s's segment not mounted in 30 s:\n%s", name, mooncaketest.Tail(p.log.String(), 3000))
		}
	}
	return p
}

// masterMetric is a counter or gauge of the master's (0 while it is down).
func (c *mooncakeCluster) masterMetric(name string) float64 {
	c.t.Helper()
	resp, err := http.Get(c.master.Metrics)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				c.t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	c.t.Fatalf("the master exports no %s", name)
	return 0
}

// checkRecord reads input img's record: committed, in Mooncake, with the
// checksum of the value the encoder makes of it (the workers verify the
// bytes they pull against this checksum).
func (c *mooncakeCluster) checkRecord(img int) {
	c.t.Helper()
	key, err := c.keyer.RawBytes(workload.Image(img))
	if err != nil {
		c.t.Fatal(err)
	}
	kvKey := coordinator.NewRef(c.keyer.Config(), key).KVKey()
	nc, err := nats.Connect(c.natsURL(img % 3))
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := inspect.Bucket(ctx, nc)
	if err != nil {
		c.t.Fatal(err)
	}
	raw, _, err := inspect.Record(ctx, b, kvKey)
	if err != nil {
		c.t.Fatalf("input %d: %v", img, err)
	}
	rec, err := lease.DecodeRecord(kvKey, raw)
	if err != nil {
		c.t.Fatalf("input %d: %v", img, err)
	}
	v, err := (&workload.Encoder{Bytes: clusterEmbedBytes}).Encode(ctx, workload.Image(img))
	if err != nil {
		c.t.Fatal(err)
	}
	enc, err := payload.Encode(v)
	if err != nil {
		c.t.Fatal(err)
	}
	want := payload.Checksum(blake3.Sum256(enc))
	if rec.State != lease.StateCommitted || rec.Location == nil || rec.Location.Transport != payload.TransportMooncake ||
		rec.Location.Checksum != want {
		c.t.Fatalf("input %d's record: %s, want committed in Mooncake with checksum %v", img, raw, want)
	}
}

// untilShared asks for new inputs from first, one at a time, on node 1's
// worker and then on node 2's, until node 2's pulls it (computed there
// meanwhile, while values cannot be shared yet), and checks its record;
// it returns the input shared.
func (c *mooncakeCluster) untilShared(ws []*clusterWorker, first int, within time.Duration) int {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for img := first; ; img++ {
		a := ws[0].ask(c.t, img)[img]
		b := ws[1].ask(c.t, img)[img]
		for _, x := range []clusterAnswer{a, b} {
			if x.Err != "" {
				c.t.Fatalf("input %d: %+v", img, x)
			}
		}
		if a.Path != "computed" && a.Path != "degraded" {
			c.t.Fatalf("input %d on node 1 first: %+v, want computed", img, a)
		}
		switch b.Path {
		case "remote-hit":
			if b.Bytes != c.size {
				c.t.Fatalf("input %d: %+v", img, b)
			}
			c.checkRecord(img)
			return img
		case "computed", "degraded":
		default:
			c.t.Fatalf("input %d on node 2: %+v", img, b)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("values not shared again within %v (input %d: %+v, %+v)", within, img, a, b)
		}
		time.Sleep(200 * time.Millisecond) // polling the store's recovery
	}
}

// clusterWorker is a worker process: requests as JSON lines on its stdin.
type clusterWorker struct {
	*clusterProc
	in      io.WriteCloser
	answers chan clusterAnswer
	id      int
}

// clusterAnswer is a worker's answer (internal/demo's Result), or its
// statistics.
type clusterAnswer struct {
	ID     int                `json:"id"`
	Image  int                `json:"image"`
	Path   string             `json:"path"`
	Millis float64            `json:"ms"`
	Bytes  int64              `json:"bytes"`
	Err    string             `json:"err"`
	Ready  bool               `json:"ready"`
	Cache  *coordinator.Stats `json:"cache"`
}

// workers starts a worker on each node, node 3's strict, and waits until
// each is ready.
func (c *mooncakeCluster) workers() []*clusterWorker {
	c.t.Helper()
	ws := make([]*clusterWorker, 3)
	for k := range 3 {
		node := fmt.Sprintf("n%d", k+1)
		p := &clusterProc{Cmd: exec.Command(c.bin, c.workerArgs(k)...), log: &syncbuf.Buffer{}}
		p.Stderr = p.log
		in, err := p.StdinPipe()
		if err != nil {
			c.t.Fatal(err)
		}
		out, err := p.StdoutPipe()
		if err != nil {
			c.t.Fatal(err)
		}
		if err := p.Start(); err != nil {
			c.t.Fatal(err)
		}
		w := &clusterWorker{clusterProc: p, in: in, answers: make(chan clusterAnswer, 64)}
		go func() {
			defer close(w.answers)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var a clusterAnswer
				if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
					a.Err = fmt.Sprintf("not an answer: %q", sc.Text())
				}
				w.answers <- a
			}
		}()
		c.t.Cleanup(func() {
			w.stop()
			if c.t.Failed() {
				c.t.Logf("worker %s's log:\n%s", node, mooncaketest.Tail(w.log.String(), 3000))
			}
		})
		ws[k] = w
	}
	for k, w := range ws {
		if a, err := w.next(); err != nil || !a.Ready {
			c.t.Fatalf("worker %d: %+v %v", k+1, a, err)
		}
	}
	return ws
}

// workerArgs are the arguments of node k+1's worker (node 3's strict).
func (c *mooncakeCluster) workerArgs(k int) []string {
	node := fmt.Sprintf("n%d", k+1)
	args := append([]string{"worker", "--nats", c.natsURL(k), "--replicas", "3", "--shm-dir", filepath.Join(c.work, node, "shm"),
		"--embed-mb", "1", "--encode-ms", "100"}, c.flags(node, 0)...)
	if k == 2 {
		args = append(args, "--strict")
	}
	return args
}

// lastLine is s's last line that is not empty.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// next is the worker's next answer.
func (w *clusterWorker) next() (clusterAnswer, error) {
	select {
	case a, ok := <-w.answers:
		if !ok {
			return a, fmt.Errorf("the worker exited:\n%s", mooncaketest.Tail(w.log.String(), 3000))
		}
		return a, nil
	case <-time.After(60 * time.Second):
		return clusterAnswer{}, fmt.Errorf("no answer from the worker in 60 s:\n%s", mooncaketest.Tail(w.log.String(), 3000))
	}
}

// request sends a request for each input at once and returns the answers by input.
func (w *clusterWorker) request(images ...int) (map[int]clusterAnswer, error) {
	for _, img := range images {
		w.id++
		fmt.Fprintf(w.in, `{"id":%d,"image":%d,"cache":true}`+"\n", w.id, img)
	}
	got := map[int]clusterAnswer{}
	for range images {
		a, err := w.next()
		if err != nil {
			return nil, err
		}
		got[a.Image] = a
	}
	return got, nil
}

// ask is request, failing t on error.
func (w *clusterWorker) ask(t *testing.T, images ...int) map[int]clusterAnswer {
	t.Helper()
	got, err := w.request(images...)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// stats are the worker's Cache's counts.
func (w *clusterWorker) stats(t *testing.T) coordinator.Stats {
	t.Helper()
	fmt.Fprintln(w.in, `{"id":-1}`)
	a, err := w.next()
	if err != nil || a.Cache == nil {
		t.Fatalf("the worker's stats: %+v %v", a, err)
	}
	return *a.Cache
}

// stop ends the worker (its input closed; killed if it has not exited
// within 30 s).
func (w *clusterWorker) stop() {
	if w.ProcessState != nil {
		return
	}
	w.in.Close()
	done := make(chan struct{})
	go func() {
		for range w.answers {
		}
		w.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		w.Process.Kill()
		<-done
	}
}

func stopWorkers(t *testing.T, ws []*clusterWorker) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(w.stop)
	}
	wg.Wait()
}

// askAll asks every worker for every input at once; answers[k][img].
func askAll(t *testing.T, ws []*clusterWorker, images []int) []map[int]clusterAnswer {
	t.Helper()
	answers := make([]map[int]clusterAnswer, len(ws))
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for k, w := range ws {
		wg.Go(func() { answers[k], errs[k] = w.request(images...) })
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", k+1, err)
		}
	}
	return answers
}

// embcacheLines are the lines the workers logged (not the Mooncake
// library's), each message once per worker with its first error.
func embcacheLines(ws []*clusterWorker) string {
	var out []string
	for k, w := range ws {
		seen := map[string]bool{}
		for _, l := range strings.Split(w.log.String(), "\n") {
			if !strings.HasPrefix(l, "time=") {
				continue
			}
			_, l, _ = strings.Cut(l, " msg=")
			msg, _, _ := strings.Cut(l, " key=")
			msg, _, _ = strings.Cut(msg, " master=")
			if _, err, ok := strings.Cut(l, " err="); ok {
				msg += " err=" + err
			}
			if key := msg[:min(len(msg), 100)]; !seen[key] { // the message, and how its error starts
				seen[key] = true
				out = append(out, fmt.Sprintf("n%d: %s", k+1, msg))
			}
		}
	}
	return strings.Join(out, "\n")
}
