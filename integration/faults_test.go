package integration

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/lease"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The fault-injection harness: each schedule starts a 3-node cluster (R3
// bucket) whose routes run through proxies that can cut a node off, and
// fault workers (this test binary re-executed: faultworker_test.go) that
// get-or-compute keys of two tenants and two models and write their
// history; a seeded schedule of faults hits them: SIGKILL of a worker,
// SIGSTOP past its lease, stop and restart of a NATS node (the stream
// leader included), a partition of one node. Meanwhile the harness
// invalidates a tenant's model one to three times. Each schedule draws its
// world: the lease bucket in 1 or 3 shards, the workers in tenant mode
// (WithTenants: direct gets) or not, and half the time one worker whose
// wall clock is 3 or 8 s off, ahead or behind. A checker
// (faultcheck_test.go) then proves from the histories: (a) no key has two
// accepted commits without an invalidation of its labels between them,
// (b) every served value is the key's bytes, made by a compute of that
// key, (c) every key's last accepted commit is still in the store unless
// an invalidation may have reached it, (d) computes per key <= 1 + the
// invalidations of its labels + the faults that hit a compute of it (or,
// if more, its computes whose commit was refused or that a fault kept
// from committing), (e) no value whose
// compute began before an invalidation of its labels is served by a
// request begun after the worker heard the invalidated event, nor,
// outside tenant mode, from the store by a request begun after Invalidate
// returned (docs/protocol.md 4.4).
//
// go test ./integration -run TestFaults -faults.schedules 200 -faults.parallel 3
// (make test-faults); make test runs a bounded number, one at a time. Each
// run draws a random base seed; schedule i runs seed base+i, and
// -faults.seed N replays one schedule. Each schedule has a cluster (fresh
// ports, store and cluster name), temp dirs and /dev/shm dir of its own, so
// schedules run side by side, loading the machine as production would.
//
// A schedule whose own setup fails (the cluster does not form, a port is
// taken, a node does not come back, a worker cannot reach the store) says
// nothing about the cache: it is counted as setup-failed, logged, and run
// again on a fresh seed; the test fails only when that happens to more
// than 2% of the schedules.
var (
	faultSchedules = flag.Int("faults.schedules", 0, "fault schedules to run (0: EMBCACHE_FAULT_SCHEDULES or 20)")
	faultParallel  = flag.Int("faults.parallel", 0, "schedules run at once (0: EMBCACHE_FAULT_PARALLEL or 1)")
	faultSeed      = flag.Uint64("faults.seed", 0, "run only the schedule with this seed")
	faultBase      = flag.Uint64("faults.base", 0, "schedule i runs seed base+i (0: a random base per run)")
	faultNoMarkers = flag.Bool("faults.nomarkers", false, "create the lease bucket without subject delete markers (docs/protocol.md 3.2)")
	faultShards    = flag.Int("faults.shards", 0, "create the lease bucket with this many shards (lease.BucketConfig.Shards; 0: 1 or 3, drawn per schedule); the workers adopt them")
)

const (
	faultWorkers, faultKeys, faultOps = 3, 10, 25

	setupTries      = 3 // runs of one schedule whose setup fails, each on a fresh seed
	setupFailPct    = 2 // the test fails when more schedules than this percentage fail their setup
	clusterTimeout  = 3 * time.Minute
	readyTimeout    = time.Minute // a worker's connect and coordinator.New
	runTimeout      = 2 * time.Minute
	restartTimeout  = 30 * time.Second
	readBackTimeout = 30 * time.Second
)

// retry calls f until it returns nil or ctx ends, waiting 100 ms after the
// first failure and twice as long after each next one (2 s at most). It
// returns f's last error.
func retry(ctx context.Context, f func() error) error {
	wait := 100 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// setupError is trouble of a schedule's own making; it says nothing about
// the cache.
type setupError struct{ err error }

func (e *setupError) Error() string { return "setup: " + e.err.Error() }
func (e *setupError) Unwrap() error { return e.err }

func setupErrorf(format string, args ...any) error {
	return &setupError{fmt.Errorf(format, args...)}
}

// faultStats adds up schedules.
type faultStats struct {
	schedules, keys, served, errors, refused, violations, setupFailed int
	refusedUnfaulted                                                  int             // commits refused with no fault injected near them (a starved machine)
	invalidations, invalidationsFailed, outdatedServed                int             // outdatedServed: values served by requests begun after an invalidation that outdated them began (within its reach)
	sharded, tenantMode, skewed                                       int             // schedules so drawn
	heardLags                                                         []time.Duration // from an Invalidate's return to a worker's applying its event
	faults                                                            map[string]int
}

func (s *faultStats) add(o faultStats) {
	s.schedules += o.schedules
	s.keys += o.keys
	s.served += o.served
	s.errors += o.errors
	s.refused += o.refused
	s.refusedUnfaulted += o.refusedUnfaulted
	s.violations += o.violations
	s.setupFailed += o.setupFailed
	s.invalidations += o.invalidations
	s.invalidationsFailed += o.invalidationsFailed
	s.outdatedServed += o.outdatedServed
	s.sharded += o.sharded
	s.tenantMode += o.tenantMode
	s.skewed += o.skewed
	s.heardLags = append(s.heardLags, o.heardLags...)
	if s.faults == nil {
		s.faults = map[string]int{}
	}
	for k, v := range o.faults {
		s.faults[k] += v
	}
}

// scheduleResult is one run of a schedule.
type scheduleResult struct {
	stats      faultStats
	faults     []string // what hit the system, in order
	violations []string // findings about the cache
	setup      error    // the schedule's own trouble: not a finding
}

func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("fault schedules take seconds each")
	}
	r := newFaultRun()
	msg := fmt.Sprintf("fault schedules starting: %d, %d at a time, base seed: %d", r.n, r.parallel, r.base)
	t.Log(msg)
	fmt.Println(msg)
	start := time.Now()
	r.runAll(t)
	r.report(t, time.Since(start))
}

// faultRun is one run of TestFaults: n schedules, parallel at a time.
type faultRun struct {
	n, parallel int
	base        uint64
	replay      bool // -faults.seed: re-runs keep the seed

	stop atomic.Bool // a schedule failed, or too many failed their setup

	mu       sync.Mutex
	total    faultStats // guarded by mu
	failed   []uint64   // seeds of the schedules that failed; guarded by mu
	nextSeed uint64     // the next fresh seed for a re-run; guarded by mu
}

func newFaultRun() *faultRun {
	r := &faultRun{
		n:        flagOrEnv(*faultSchedules, "EMBCACHE_FAULT_SCHEDULES", 20),
		parallel: flagOrEnv(*faultParallel, "EMBCACHE_FAULT_PARALLEL", 1),
		base:     *faultBase,
	}
	if r.base == 0 {
		r.base = 1 + rand.Uint64N(1<<48) // room for base+i; short enough to type
	}
	if *faultSeed != 0 {
		r.n, r.parallel, r.base, r.replay = 1, 1, *faultSeed, true
	}
	r.nextSeed = r.base + uint64(r.n)
	return r
}

// flagOrEnv is v if set, else the environment variable env if set, else def.
func flagOrEnv(v int, env string, def int) int {
	if v <= 0 {
		v, _ = strconv.Atoi(os.Getenv(env))
	}
	if v <= 0 {
		v = def
	}
	return v
}

// runAll runs the schedules, r.parallel at a time, each as a subtest; it
// starts no new one once r.stop is set.
func (r *faultRun) runAll(t *testing.T) {
	sem := make(chan struct{}, r.parallel)
	var wg sync.WaitGroup
	for i := range r.n {
		sem <- struct{}{}
		if r.stop.Load() {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			t.Run(fmt.Sprintf("schedule-%d", i), func(t *testing.T) { r.runOne(t, r.base+uint64(i)) })
		})
	}
	wg.Wait()
}

// runOne runs one schedule, again on a fresh seed while its setup fails
// (setupTries runs at most).
func (r *faultRun) runOne(t *testing.T, seed uint64) {
	for try := 1; ; try++ {
		res := runSchedule(t, seed)
		r.record(seed, res)
		if r.replay || len(res.violations) > 0 {
			t.Logf("seed %d: faults: %s", seed, strings.Join(res.faults, ", "))
		}
		if len(res.violations) > 0 {
			for _, v := range res.violations {
				t.Errorf("seed %d: %s", seed, v)
			}
			t.Errorf("seed %d failed: replay it with go test ./integration -run TestFaults -faults.seed %d", seed, seed)
			return
		}
		if res.setup == nil {
			return
		}
		if r.stop.Load() {
			t.Logf("seed %d: setup failed (not a finding about the cache; not re-run, the run is stopping): %v", seed, res.setup)
			return
		}
		if try == setupTries {
			t.Errorf("seed %d: setup failed in %d runs of this schedule in a row (not a finding about the cache): %v",
				seed, try, res.setup)
			return
		}
		next := r.freshSeed(seed)
		t.Logf("seed %d: setup failed (not a finding about the cache; re-run as seed %d): %v", seed, next, res.setup)
		seed = next
	}
}

// record adds a schedule's result to the totals; a failed schedule, or
// one setup failure too many, stops the run.
func (r *faultRun) record(seed uint64, res scheduleResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := res.stats
	st.violations = len(res.violations)
	if res.setup != nil {
		st = faultStats{violations: st.violations, setupFailed: 1}
	} else {
		st.schedules = 1
	}
	r.total.add(st)
	if len(res.violations) > 0 {
		r.failed = append(r.failed, seed)
		r.stop.Store(true)
	}
	if r.total.setupFailed > r.setupAllowed() {
		r.stop.Store(true)
	}
}

// setupAllowed is how many setup failures a run tolerates.
func (r *faultRun) setupAllowed() int { return max(1, r.n*setupFailPct/100) }

// freshSeed is the seed a schedule is re-run on: the same when replaying.
func (r *faultRun) freshSeed(seed uint64) uint64 {
	if r.replay {
		return seed
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextSeed++
	return r.nextSeed - 1
}

// report prints the summary line and fails the test on too many setup
// failures.
func (r *faultRun) report(t *testing.T, wall time.Duration) {
	r.mu.Lock()
	total, failed := r.total, slices.Clone(r.failed)
	r.mu.Unlock()
	kinds := make([]string, 0, len(total.faults))
	for k, v := range total.faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, v))
	}
	slices.Sort(kinds)
	if len(kinds) == 0 {
		kinds = []string{"none"}
	}
	bucket := "markers"
	if *faultNoMarkers {
		bucket = "no markers"
	}
	msg := fmt.Sprintf("fault schedules: %d, base seed: %d, bucket: %s, sharded: %d, tenant mode: %d, a skewed clock: %d, "+
		"faults: %s, invalidations: %d (failed: %d), keys: %d, values served: %d (outdated by an invalidation begun before the request, within its reach: %d), "+
		"errors retried: %d, commits refused: %d (%d with no fault injected near), setup-failed (re-run): %d, violations: %d, wall time: %s",
		total.schedules, r.base, bucket, total.sharded, total.tenantMode, total.skewed, strings.Join(kinds, " "),
		total.invalidations, total.invalidationsFailed, total.keys, total.served, total.outdatedServed, total.errors,
		total.refused, total.refusedUnfaulted, total.setupFailed, total.violations, wall.Round(100*time.Millisecond))
	if lags := total.heardLags; len(lags) > 0 {
		slices.Sort(lags)
		q := func(p float64) time.Duration { return lags[int(p*float64(len(lags)-1))].Round(100 * time.Microsecond) }
		msg += fmt.Sprintf("; an invalidated event applied by a worker, after Invalidate returned: p50 %v, p99 %v, max %v (%d)",
			q(0.5), q(0.99), lags[len(lags)-1].Round(time.Millisecond), len(lags))
	}
	t.Log(msg)
	fmt.Println(msg)
	if total.setupFailed > r.setupAllowed() {
		t.Errorf("setup failed in %d of %d schedules (at most %d tolerated): see the \"setup failed\" lines above",
			total.setupFailed, r.n, r.setupAllowed())
	}
	for _, seed := range failed {
		t.Errorf("schedule with seed %d failed: replay it with go test ./integration -run TestFaults -faults.seed %d", seed, seed)
	}
}

// schedule is one schedule's world: its cluster, links, workers and faults.
type schedule struct {
	t       *testing.T
	seed    uint64
	rng     *rand.Rand
	cl      *embedded.Cluster
	links   *links
	shmDir  string
	procs   []*faultProc
	faults  map[string]int
	log     []string // the faults in order, with their targets
	windows []window // when each fault reached the system

	shards     int                         // the lease bucket's
	tenantMode bool                        // the workers serve their tenants only (WithTenants)
	skew       [faultWorkers]time.Duration // each worker's clock error (a replacement has its predecessor's)
	invs       []invalidation              // the harness's, in order; written by invalidate until it returns
}

// draw draws the schedule's world from its seed.
func (s *schedule) draw() {
	s.shards = *faultShards
	if s.shards == 0 {
		s.shards = []int{1, 3}[s.rng.IntN(2)]
	}
	s.tenantMode = s.rng.IntN(2) == 0
	if s.rng.IntN(2) == 0 {
		off := []time.Duration{3 * time.Second, 8 * time.Second}[s.rng.IntN(2)]
		if s.rng.IntN(2) == 0 {
			off = -off
		}
		s.skew[s.rng.IntN(faultWorkers)] = off
	}
}

// world says what draw drew, for the log.
func (s *schedule) world() string {
	w := fmt.Sprintf("shards %d, tenant mode %v", s.shards, s.tenantMode)
	for i, off := range s.skew {
		if off != 0 {
			w += fmt.Sprintf(", w%d's clock %+v", i, off)
		}
	}
	return w
}

// drawn is the world's share of the stats.
func (s *schedule) drawn() faultStats {
	var st faultStats
	if s.shards > 1 {
		st.sharded = 1
	}
	if s.tenantMode {
		st.tenantMode = 1
	}
	if slices.ContainsFunc(s.skew[:], func(d time.Duration) bool { return d != 0 }) {
		st.skewed = 1
	}
	return st
}

// invalidate issues one to three invalidations, one at a time, each of a
// tenant's model drawn from rng, at seeded times while the workers run.
// It runs beside the faults, on a connection of its own.
func (s *schedule) invalidate(ctx context.Context, rng *rand.Rand) {
	nc, err := s.cl.Connect(nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		return // no invalidation: the schedule checks the rest
	}
	defer nc.Close()
	for range 1 + rng.IntN(3) {
		time.Sleep(time.Duration(200+rng.IntN(1200)) * time.Millisecond) // the schedule's clock
		l := labels{faultTenants[rng.IntN(len(faultTenants))], faultModels[rng.IntN(len(faultModels))]}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		from := time.Now().UnixNano()
		err := coordinator.Invalidate(ictx, nc, coordinator.Invalidation{Tenant: l.Tenant, Model: l.Model, Node: "harness"})
		s.invs = append(s.invs, invalidation{labels: l, from: from, to: time.Now().UnixNano(), ok: err == nil})
		cancel()
	}
}

// fault records a fault of kind that hit target.
func (s *schedule) fault(kind, target string) {
	s.faults[kind]++
	s.log = append(s.log, kind+" "+target)
}

// window is a fault's reach, in unix nanos.
type window struct{ from, to int64 }

// runSchedule runs the schedule of seed: setup, two faults, the checker.
func runSchedule(t *testing.T, seed uint64) (res scheduleResult) {
	s := &schedule{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 99)), faults: map[string]int{}}
	defer s.close()
	s.draw()
	if res.setup = s.setUp(); res.setup != nil {
		return res
	}
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	res.setup = s.startWorkers(ctx)
	invalidating := make(chan struct{})
	go func(started bool) {
		defer close(invalidating)
		if started {
			s.invalidate(ctx, rand.New(rand.NewPCG(seed, 7)))
		}
	}(res.setup == nil)
	for f := range 2 {
		if res.setup != nil {
			break
		}
		res.setup = s.inject(ctx, f)
	}
	<-invalidating
	if res.setup != nil {
		s.killWorkers() // the schedule is over; what they did so far is still checked
	}
	res.violations = s.waitWorkers(ctx)
	if err := s.workerSetupTrouble(); err != nil && res.setup == nil {
		res.setup = err
	}
	res.violations = append(res.violations, s.workerCrashes()...)

	h := newHistories(s.history(), s.windows, s.invs, s.tenantMode)
	st, commits, vs := h.check()
	res.violations = append(res.violations, vs...)
	if res.setup == nil {
		cctx, ccancel := context.WithTimeout(context.Background(), runTimeout)
		defer ccancel()
		vs, err := s.checkStore(cctx, h, commits)
		res.violations, res.setup = append(res.violations, vs...), err
	}
	st.faults = s.faults
	d := s.drawn()
	st.sharded, st.tenantMode, st.skewed = d.sharded, d.tenantMode, d.skewed
	res.stats, res.faults = st, append([]string{s.world()}, s.log...)
	return res
}

// setUp starts the cluster behind its links and makes the shm dir.
func (s *schedule) setUp() error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	s.links = &links{}
	cl, err := embedded.StartCluster(ctx, 3, s.t.TempDir(), s.links.configure)
	if err != nil {
		return setupErrorf("cluster: %w", err)
	}
	s.cl = cl
	if s.links.err != nil {
		return setupErrorf("links: %w", s.links.err)
	}
	if *faultNoMarkers {
		if err := createNoMarkerBucket(ctx, cl); err != nil {
			return setupErrorf("bucket without markers: %w", err)
		}
	}
	if s.shards > 1 {
		if err := createShardedBucket(ctx, cl, s.shards); err != nil {
			return setupErrorf("sharded bucket: %w", err)
		}
	}
	if s.shmDir, err = os.MkdirTemp("/dev/shm", "embcache-faults-"); err != nil {
		s.shmDir = s.t.TempDir()
	}
	return nil
}

// createNoMarkerBucket creates the lease bucket's stream before any worker
// does, without subject delete markers; the workers bind it as it is.
func createNoMarkerBucket(ctx context.Context, cl *embedded.Cluster) error {
	nc, err := cl.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	return retry(ctx, func() error {
		_, err := js.CreateStream(ctx, noMarkerKVStream(lease.DefaultBucket, 3))
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil
		}
		return err
	})
}

// createShardedBucket creates the lease bucket with k shards before any
// worker starts: they read the number from the bucket.
func createShardedBucket(ctx context.Context, cl *embedded.Cluster, k int) error {
	nc, err := cl.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	return retry(ctx, func() error {
		_, err := lease.OpenBucket(ctx, nc, lease.BucketConfig{Name: lease.DefaultBucket, Replicas: 3, MarkerTTL: time.Minute, Shards: k})
		return err
	})
}

// close kills what is left of the workers and stops the cluster and links.
func (s *schedule) close() {
	s.killWorkers()
	for _, p := range s.procs {
		<-p.done
	}
	if s.cl != nil {
		s.cl.Shutdown()
	}
	if s.links != nil {
		s.links.close()
	}
	if strings.HasPrefix(s.shmDir, "/dev/shm/") {
		os.RemoveAll(s.shmDir)
	}
}

// links are the route proxies of a cluster, each link on a node's route
// to another; byNode[i] are the links of node i.
type links struct {
	isolate bool // every route through a proxy, none around it (see configure)
	all     []*proxy
	byNode  map[int][]*proxy
	err     error // the first proxy that could not start
}

// configure is StartCluster's: it routes node i to the others through
// proxies. i == 0 begins an attempt: the links of a failed one go.
func (l *links) configure(i int, o *embedded.Options) {
	if i == 0 {
		l.close()
		*l = links{isolate: l.isolate, byNode: map[int][]*proxy{}}
	}
	var routes []string
	for j, r := range o.Routes {
		if j == i {
			continue
		}
		p, err := newProxy(strings.TrimPrefix(r, "nats-route://"))
		if err != nil {
			l.err = cmp.Or(l.err, err)
			continue
		}
		l.all = append(l.all, p)
		l.byNode[i] = append(l.byNode[i], p)
		l.byNode[j] = append(l.byNode[j], p)
		routes = append(routes, "nats-route://"+p.addr())
	}
	o.Routes = routes
	if !l.isolate {
		return
	}
	// A node tells the others its route address, and they connect to it
	// when a route is down (the route gossip's implicit routes): through
	// the real cluster port, around the proxies, which healed a cut within
	// about 2 s. Advertised as a port nothing listens on, every route goes
	// through a proxy. (The fault harness does not: its clusters then
	// failed to create their sharded buckets in 5 of 92 schedules, within
	// 3 minutes.)
	configure := o.Configure
	o.Configure = func(so *server.Options) error {
		so.Cluster.Advertise = "127.0.0.1:1"
		if configure != nil {
			return configure(so)
		}
		return nil
	}
}

func (l *links) close() {
	for _, p := range l.all {
		p.close()
	}
}

// setCut cuts (or heals) every link of node k.
func (l *links) setCut(k int, cut bool) {
	for _, p := range l.byNode[k] {
		p.setCut(cut)
	}
}

// faultProc is one fault worker process and its history.
type faultProc struct {
	name   string
	cmd    *exec.Cmd
	stderr bytes.Buffer // read only after done
	killed atomic.Bool  // the harness killed it

	mu    sync.Mutex
	lines []hist // guarded by mu

	ready chan struct{} // closed at its "ready" line
	done  chan struct{} // closed once it has exited and its output is read
}

// startWorker starts a fault worker; a goroutine collects its history
// until it exits.
func (s *schedule) startWorker(name string, i int, wseed uint64) (*faultProc, error) {
	tenantMode := "0"
	if s.tenantMode {
		tenantMode = "1"
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "EMBCACHE_WORKER="+modeFault, "EMBCACHE_WORKER_NAME="+name,
		"EMBCACHE_NATS="+s.cl.ClientURLs(), "EMBCACHE_SHM="+s.shmDir, "EMBCACHE_KEYS="+strconv.Itoa(faultKeys),
		"EMBCACHE_OPS="+strconv.Itoa(faultOps), "EMBCACHE_SEED="+strconv.FormatUint(wseed, 10),
		"EMBCACHE_TENANT_MODE="+tenantMode, "EMBCACHE_SKEW="+s.skew[i].String())
	p := &faultProc{name: name, cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = &p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, setupErrorf("worker %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, setupErrorf("worker %s: %w", name, err)
	}
	s.procs = append(s.procs, p)
	go p.collect(stdout)
	return p, nil
}

func (p *faultProc) collect(stdout io.Reader) {
	defer close(p.done)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var h hist
		if json.Unmarshal(sc.Bytes(), &h) != nil {
			continue
		}
		p.mu.Lock()
		p.lines = append(p.lines, h)
		p.mu.Unlock()
		if h.Ev == "ready" {
			close(p.ready)
		}
	}
	io.Copy(io.Discard, stdout) // past a line too long to scan: the worker must not block on a full pipe
	p.cmd.Wait()
}

// isReady reports whether the worker has said it is ready.
func (p *faultProc) isReady() bool {
	select {
	case <-p.ready:
		return true
	default:
		return false
	}
}

func (p *faultProc) kill() {
	p.killed.Store(true)
	p.cmd.Process.Kill()
}

// history is a copy of the worker's lines so far.
func (p *faultProc) history() []hist {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lines)
}

// startWorkers starts the workers and waits until each is ready, so that
// the schedule's clock starts when they work, however loaded the machine.
func (s *schedule) startWorkers(ctx context.Context) error {
	for w := range faultWorkers {
		if _, err := s.startWorker(fmt.Sprint("w", w), w, s.seed*100+uint64(w)); err != nil {
			return err
		}
	}
	for _, p := range s.procs {
		select {
		case <-p.ready:
		case <-p.done: // ready, if it was, is closed before done
			if !p.isReady() {
				return setupErrorf("worker %s exited before it was ready: %s", p.name, p.setupNote())
			}
		case <-ctx.Done():
			return setupErrorf("worker %s not ready: %w", p.name, ctx.Err())
		}
	}
	return nil
}

// setupNote is the worker's worker-wide error line, or its stderr.
func (p *faultProc) setupNote() string {
	for _, h := range p.history() {
		if h.Ev == "error" && h.Key == -1 {
			return h.Note
		}
	}
	return tail(p.stderr.String(), 2000)
}

// inject is fault f of the schedule, at a seeded time; an error is setup
// trouble (a node that does not come back).
func (s *schedule) inject(ctx context.Context, f int) error {
	time.Sleep(time.Duration(300+s.rng.IntN(900)) * time.Millisecond) // the schedule's clock
	from := time.Now().UnixNano()
	var err error
	switch kind := s.rng.IntN(4); kind {
	case 0:
		err = s.killWorker(f)
	case 1:
		s.pauseWorker()
	case 2:
		err = s.stopNode(ctx)
	case 3:
		s.partitionNode()
	}
	// A fault's reach outlasts it: elections and reconnects settle after it.
	s.windows = append(s.windows, window{from, time.Now().Add(3 * time.Second).UnixNano()})
	return err
}

// killWorker SIGKILLs a worker and starts a replacement.
func (s *schedule) killWorker(f int) error {
	i := s.rng.IntN(len(s.procs))
	s.procs[i].kill()
	<-s.procs[i].done
	s.fault("kill-worker", s.procs[i].name)
	_, err := s.startWorker(fmt.Sprintf("w%d-r%d", i, f), i%faultWorkers, s.seed*100+uint64(10+f))
	return err
}

// pauseWorker SIGSTOPs a worker past its lease.
func (s *schedule) pauseWorker() {
	p := s.procs[s.rng.IntN(len(s.procs))]
	p.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(1500 * time.Millisecond)
	p.cmd.Process.Signal(syscall.SIGCONT)
	s.fault("pause-worker", p.name)
}

// stopNode stops a NATS node (half the time the stream leader) and
// restarts it.
func (s *schedule) stopNode(ctx context.Context) error {
	node := s.cl.Nodes[s.rng.IntN(3)]
	if s.rng.IntN(2) == 0 {
		if l := s.streamLeader(ctx); l != nil {
			node = l
		}
	}
	node.Shutdown()
	time.Sleep(time.Duration(500+s.rng.IntN(1000)) * time.Millisecond)
	s.fault("stop-node", node.Name())
	return restartNode(ctx, node)
}

// streamLeader is the node leading the bucket's stream, or nil.
func (s *schedule) streamLeader(ctx context.Context) *embedded.Server {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nc, err := s.cl.Connect()
	if err != nil {
		return nil
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil
	}
	l, err := s.cl.StreamLeader(ctx, js, "KV_"+lease.DefaultBucket)
	if err != nil {
		return nil
	}
	return l
}

// restartNode restarts a node, backing off while its port is briefly taken
// (restartTimeout at most); the store on disk is what matters.
func restartNode(ctx context.Context, node *embedded.Server) error {
	ctx, cancel := context.WithTimeout(ctx, restartTimeout)
	defer cancel()
	if err := retry(ctx, node.Restart); err != nil {
		return setupErrorf("restart of %s: %w", node.Name(), err)
	}
	return nil
}

// partitionNode cuts one node off the others for a while.
func (s *schedule) partitionNode() {
	k := s.rng.IntN(3)
	s.links.setCut(k, true)
	time.Sleep(time.Duration(500+s.rng.IntN(1000)) * time.Millisecond)
	s.links.setCut(k, false)
	s.fault("partition-node", s.cl.Nodes[k].Name())
}

// killWorkers kills the workers still running.
func (s *schedule) killWorkers() {
	for _, p := range s.procs {
		select {
		case <-p.done:
		default:
			p.kill()
		}
	}
}

// waitWorkers waits for every worker to finish; one still running when
// ctx ends is stuck, which is a finding.
func (s *schedule) waitWorkers(ctx context.Context) []string {
	var vs []string
	for _, p := range s.procs {
		select {
		case <-p.done:
		case <-ctx.Done():
			p.kill()
			<-p.done
			vs = append(vs, fmt.Sprintf("worker %s did not finish in %v", p.name, runTimeout))
		}
	}
	return vs
}

// workerSetupTrouble is the first worker-wide error line of a worker: it
// could not reach the store in readyTimeout.
func (s *schedule) workerSetupTrouble() error {
	for _, p := range s.procs {
		for _, h := range p.history() {
			if h.Ev == "error" && h.Key == -1 {
				return setupErrorf("worker %s: %s", p.name, h.Note)
			}
		}
	}
	return nil
}

// workerCrashes are the workers that died on their own, without a
// worker-wide error line: a panic, or a data race the race detector saw.
func (s *schedule) workerCrashes() []string {
	var vs []string
	for _, p := range s.procs {
		if p.killed.Load() || p.cmd.ProcessState == nil || p.cmd.ProcessState.Success() {
			continue
		}
		if slices.ContainsFunc(p.history(), func(h hist) bool { return h.Ev == "error" && h.Key == -1 }) {
			continue
		}
		vs = append(vs, fmt.Sprintf("worker %s crashed (%v):\n%s", p.name, p.cmd.ProcessState, tail(p.stderr.String(), 4000)))
	}
	return vs
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// history is every worker's history, in time order.
func (s *schedule) history() []hist {
	var all []hist
	for _, p := range s.procs {
		all = append(all, p.history()...)
	}
	slices.SortStableFunc(all, func(a, b hist) int { return int(a.T - b.T) })
	return all
}
