package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/spf13/pflag"
)

// The workload suite: P processes x C goroutines ask for Zipf-distributed
// inputs, each system in turn, with the same inputs, encoder and payload
// bytes. Processes are real: the bench re-executes this binary as
// `embcache-bench worker`, one per process, and starts what a system needs
// (an embedded NATS server or cluster, a redis-server) itself.

// workloadFlags size the dedup workload.
type workloadFlags struct {
	procs, goroutines, unique, requests, encodeMS int
	zipf, embedMB                                 float64
	systems                                       string
	rounds                                        int
	shards                                        int    // embcache: lease shards (0: one)
	mooncakeDir                                   string // embcache-r1-mooncake: a Mooncake install
}

func (w *workloadFlags) register(fs *pflag.FlagSet) {
	fs.IntVar(&w.procs, "procs", 3, "workload: processes")
	fs.IntVar(&w.goroutines, "goroutines", 4, "workload: goroutines per process")
	fs.IntVar(&w.unique, "unique", 100, "workload: unique inputs")
	fs.IntVar(&w.requests, "requests", 900, "workload: requests in all")
	fs.Float64Var(&w.zipf, "zipf", 1.1, "workload: Zipf exponent of input popularity")
	fs.IntVar(&w.encodeMS, "encode-ms", 20, "workload: milliseconds of GPU time per forward (plus the CPU decode)")
	fs.Float64Var(&w.embedMB, "embed-mb", 2, "workload: embedding size in MiB")
	fs.StringVar(&w.systems, "systems", strings.Join(allSystems, ","), "workload: systems to compare")
	fs.IntVar(&w.rounds, "rounds", 3, "workload: runs per system; the run with the median requests/s is reported")
	fs.StringVar(&w.mooncakeDir, "mooncake-dir", defaultMooncakeDir(), "workload: a Mooncake install (lib/libmooncake_store.so, bin/mooncake_master) for embcache-r1-mooncake, "+
		"which needs a binary built with cgo and -tags mooncake (make build-bench-mooncake; default $EMBCACHE_MOONCAKE_DIR or $MOONCAKE_DIR)")
}

// workloadRow is one system's run.
type workloadRow struct {
	System           string  `json:"system"`
	Procs            int     `json:"procs"`
	Goroutines       int     `json:"goroutines"`
	Requests         int     `json:"requests"`
	Unique           int     `json:"unique"`
	Forwards         int     `json:"forwards"`
	ForwardsPerInput float64 `json:"forwards_per_unique_input"`
	RequestsPerSec   float64 `json:"requests_per_s"`
	P50ms            float64 `json:"p50_ms"`
	P99ms            float64 `json:"p99_ms"`
	MaxMs            float64 `json:"max_ms"`
	MsgsPerRequest   float64 `json:"messages_per_request"`
	// ServerCPUms is the CPU time the system's servers (the embedded NATS
	// servers, redis-server) used during the run; -1 if unknown.
	ServerCPUms float64 `json:"server_cpu_ms"`
	// WorkerCPUms is the worker processes' CPU time during the run.
	WorkerCPUms float64 `json:"worker_cpu_ms"`
	// DeliveredPerRequest counts only the messages delivered to the
	// processes (NATS systems): replies, acks, waiters' changes, events.
	DeliveredPerRequest float64   `json:"delivered_per_request,omitempty"`
	Errors              int       `json:"errors"`
	Seconds             float64   `json:"seconds"`
	Skipped             string    `json:"skipped,omitempty"`
	Details             []any     `json:"details,omitempty"` // per process, what the system counted
	Runs                int       `json:"runs"`
	RunsPerSec          []float64 `json:"runs_requests_per_s"` // every run, ascending; the row is the median run
	MaxForwards         int       `json:"max_forwards"`        // the most forwards of any run
	// Leaders are the servers that lead the lease bucket's shards (R3).
	Leaders []string `json:"leaders,omitempty"`
}

// dedupResult is one worker process's report.
type dedupResult struct {
	Forwards  int     `json:"forwards"`
	Requests  int     `json:"requests"`
	Errors    int     `json:"errors"`
	FirstErr  string  `json:"first_err,omitempty"`
	Latencies []int64 `json:"latencies_us"`
	Messages  uint64  `json:"messages"`
	Delivered uint64  `json:"delivered,omitempty"`
	CPUms     float64 `json:"cpu_ms"` // this process's CPU time from go to its last request
	Detail    any     `json:"detail,omitempty"`
}

// deliveryCounter is a system that tells the messages delivered to this
// process apart from those it sent.
type deliveryCounter interface{ delivered() uint64 }

func deliveredOf(sys dedupSystem) uint64 {
	if d, ok := sys.(deliveryCounter); ok {
		return d.delivered()
	}
	return 0
}

func (w workloadFlags) validate(quick bool) (workloadFlags, error) {
	if quick {
		w.procs, w.goroutines, w.unique, w.requests, w.encodeMS, w.embedMB, w.rounds = 2, 2, 8, 40, 2, 0.0625, 1
	}
	if w.procs < 1 || w.goroutines < 1 || w.unique < 1 || w.requests < w.unique || w.encodeMS < 0 || w.embedMB <= 0 || w.rounds < 1 {
		return w, usagef("workload: need procs, goroutines, unique, rounds >= 1, requests >= unique, encode-ms >= 0, embed-mb > 0")
	}
	for _, s := range strings.Split(w.systems, ",") {
		if !slices.Contains(allSystems, s) {
			return w, usagef("workload: unknown system %q (%s)", s, strings.Join(allSystems, ", "))
		}
	}
	return w, nil
}

func benchWorkload(ctx context.Context, wf workloadFlags, log io.Writer) ([]workloadRow, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var rows []workloadRow
	for _, sys := range strings.Split(wf.systems, ",") {
		var runs []workloadRow
		for i := range wf.rounds {
			fmt.Fprintf(log, "workload: %s (run %d of %d) ...\n", sys, i+1, wf.rounds)
			row, err := runSystem(ctx, self, sys, wf)
			if err != nil {
				return rows, fmt.Errorf("%s: %w", sys, err)
			}
			runs = append(runs, row)
			if row.Skipped != "" && row.Seconds == 0 { // it cannot run here: once says why
				break
			}
		}
		slices.SortFunc(runs, func(a, b workloadRow) int { return cmp.Compare(a.RequestsPerSec, b.RequestsPerSec) })
		row := runs[len(runs)/2]
		row.Runs = len(runs)
		for _, r := range runs {
			row.RunsPerSec = append(row.RunsPerSec, r.RequestsPerSec)
			row.MaxForwards = max(row.MaxForwards, r.Forwards)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func runSystem(ctx context.Context, self, sys string, wf workloadFlags) (workloadRow, error) {
	row := workloadRow{System: sys, Procs: wf.procs, Goroutines: wf.goroutines, Requests: wf.requests, Unique: wf.unique}
	dir, err := os.MkdirTemp("", "embcache-bench-")
	if err != nil {
		return row, err
	}
	defer os.RemoveAll(dir)
	shmDir := dir
	if d, err := os.MkdirTemp("/dev/shm", "embcache-bench-"); err == nil { // payloads in memory, as in production
		shmDir = d
		defer os.RemoveAll(d)
	}
	base := dedupConfig{System: sys, Procs: wf.procs, Goroutines: wf.goroutines, Unique: wf.unique, Requests: wf.requests,
		Zipf: wf.zipf, Seed: 1, EncodeMS: wf.encodeMS, EmbedBytes: int(wf.embedMB * (1 << 20)), ShmDir: shmDir,
		LocalMaxByte: 4 << 30, Shards: wf.shards}
	for range wf.procs {
		port, err := embedded.FreePort("127.0.0.1")
		if err != nil {
			return row, err
		}
		base.PeerAddrs = append(base.PeerAddrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	var leaders func() []string // where the bucket's shards are led, after the run
	cpu := cpuClock(selfCPU)
	switch sys {
	case sysEmbcache, sysEmbcacheNS, sysEmbcacheSh, sysEmbcacheMC:
		if sys == sysEmbcacheMC {
			if why := mooncakeSkip(wf.mooncakeDir); why != "" {
				row.Skipped = why
				return row, nil
			}
			mc, pid, stop, err := startMooncakeMaster(wf.mooncakeDir)
			if err != nil {
				return row, err
			}
			defer stop()
			base.Mooncake, cpu = &mc, processCPU(pid)
		}
		srv, err := embedded.Start(embedded.Options{StoreDir: dir, NoSync: sys == sysEmbcacheNS})
		if err != nil {
			return row, err
		}
		defer srv.Shutdown()
		base.NATS, base.Replicas = srv.ClientURL(), 1
	case sysEmbcacheR3:
		cl, err := embedded.StartCluster(ctx, 3, dir, nil)
		if err != nil {
			return row, err
		}
		defer cl.Shutdown()
		base.NATS, base.Replicas = cl.ClientURLs(), 3
		if wf.shards > 1 {
			// Created here, and its leaders spread as the active
			// reconciler would (the workers run none).
			if err := createShards(ctx, cl, wf.shards); err != nil {
				return row, err
			}
		}
		leaders = func() []string { return shardLeaders(ctx, cl) }
	case sysRedis:
		addr, pid, stop, err := startRedis(ctx, dir)
		if errors.Is(err, exec.ErrNotFound) {
			row.Skipped = "redis-server not installed (make bench installs Debian's)"
			return row, nil
		}
		if err != nil {
			return row, err
		}
		defer stop()
		base.Redis, cpu = addr, processCPU(pid)
	}
	results, elapsed, used, err := runWorkers(ctx, self, base, cpu)
	if err != nil {
		return row, err
	}
	if leaders != nil {
		row.Leaders = leaders()
	}
	var lat []int64
	var msgs, delivered uint64
	for _, r := range results {
		row.Forwards += r.Forwards
		row.Errors += r.Errors
		msgs += r.Messages
		row.WorkerCPUms += r.CPUms
		delivered += r.Delivered
		lat = append(lat, r.Latencies...)
		row.Details = append(row.Details, r.Detail)
		if r.FirstErr != "" && row.Skipped == "" {
			row.Skipped = "first error: " + r.FirstErr
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		row.P50ms = float64(lat[len(lat)/2]) / 1000
		row.P99ms = float64(lat[min(len(lat)-1, len(lat)*99/100)]) / 1000
		row.MaxMs = float64(lat[len(lat)-1]) / 1000
	}
	row.ForwardsPerInput = float64(row.Forwards) / float64(wf.unique)
	row.Seconds = elapsed.Seconds()
	row.ServerCPUms = -1
	if used >= 0 {
		row.ServerCPUms = float64(used) / float64(time.Millisecond)
	}
	row.RequestsPerSec = float64(wf.requests) / elapsed.Seconds()
	row.MsgsPerRequest = float64(msgs) / float64(wf.requests)
	row.DeliveredPerRequest = float64(delivered) / float64(wf.requests)
	return row, nil
}

// runWorkers starts one worker per process, waits until all are ready,
// starts them together and collects their reports, and the time and the
// servers' CPU (cpu; -1 if unread) from the start until the last worker
// is done.
func runWorkers(ctx context.Context, self string, base dedupConfig, cpu cpuClock) ([]dedupResult, time.Duration, time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type proc struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		out    *bufio.Reader
		stderr bytes.Buffer
	}
	procs := make([]*proc, base.Procs)
	defer func() {
		for _, p := range procs {
			if p != nil {
				p.stdin.Close()
				p.cmd.Wait()
			}
		}
	}()
	fail := func(p *proc, err error) error {
		return fmt.Errorf("%w; worker stderr: %s", err, strings.TrimSpace(p.stderr.String()))
	}
	for i := range procs {
		cfg := base
		cfg.Proc = i
		b, _ := json.Marshal(cfg)
		p := &proc{cmd: exec.CommandContext(ctx, self, "worker", "--config", string(b))}
		p.cmd.Stderr = &p.stderr
		var err error
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			return nil, 0, 0, err
		}
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			return nil, 0, 0, err
		}
		p.out = bufio.NewReader(stdout)
		if err := p.cmd.Start(); err != nil {
			return nil, 0, 0, err
		}
		procs[i] = p
	}
	for _, p := range procs {
		if _, err := p.out.ReadBytes('\n'); err != nil { // {"ready":true}
			p.cmd.Wait()
			return nil, 0, 0, fail(p, fmt.Errorf("worker did not get ready: %w", err))
		}
	}
	if dir := os.Getenv(cpuProfileEnv); dir != "" { // the embedded servers run in this process
		stop, err := startCPUProfile(filepath.Join(dir, base.System+"-servers.pprof"))
		if err != nil {
			return nil, 0, 0, err
		}
		defer stop()
	}
	cpu0, cpuErr := cpu()
	start := time.Now()
	for _, p := range procs {
		io.WriteString(p.stdin, "go\n")
	}
	results := make([]dedupResult, len(procs))
	read := func(i int, p *proc, into *dedupResult) error {
		line, err := p.out.ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, into)
		}
		if err != nil {
			p.cmd.Wait()
			return fail(p, fmt.Errorf("worker %d: %w", i, err))
		}
		return nil
	}
	for i, p := range procs {
		if err := read(i, p, &results[i]); err != nil {
			return nil, 0, 0, err
		}
	}
	elapsed := time.Since(start)
	used := time.Duration(-1)
	if cpu1, err := cpu(); err == nil && cpuErr == nil {
		used = cpu1 - cpu0
	}
	for _, p := range procs {
		io.WriteString(p.stdin, "report\n")
	}
	for i, p := range procs {
		var r dedupResult
		if err := read(i, p, &r); err != nil {
			return nil, 0, 0, err
		}
		results[i].Forwards, results[i].Messages, results[i].Delivered, results[i].Detail = r.Forwards, r.Messages, r.Delivered, r.Detail
	}
	return results, elapsed, used, nil
}

// cpuProfileEnv names a directory where each worker process writes a CPU
// profile of its run (<system>-<proc>.pprof), and the bench process, which
// runs the embedded NATS servers, its own (<system>-servers.pprof), for
// finding where a system's requests spend their time.
const cpuProfileEnv = "EMBCACHE_BENCH_CPUPROFILE"

func printWorkload(w io.Writer, rows []workloadRow) {
	var ref float64
	for _, r := range rows {
		if r.System == sysEmbcache {
			ref = r.RequestsPerSec
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "system\tforwards\tper input\treq/s\tembcache-r1 speedup\tp50 ms\tp99 ms\tmsgs/req\tworker CPU ms\tserver CPU ms\terrors\tnote")
	for _, r := range rows {
		if r.Skipped != "" && r.Seconds == 0 {
			fmt.Fprintf(tw, "%s\t\t\t\t\t\t\t\t\t\t\t%s\n", r.System, r.Skipped)
			continue
		}
		ratio := "-"
		if ref > 0 && r.RequestsPerSec > 0 {
			ratio = fmt.Sprintf("%.2fx", ref/r.RequestsPerSec)
		}
		serverCPU := "-"
		if r.ServerCPUms >= 0 {
			serverCPU = fmt.Sprintf("%.0f", r.ServerCPUms)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.1f\t%s\t%.3f\t%.1f\t%.1f\t%.0f\t%s\t%d\t%s\n", r.System, r.Forwards, r.ForwardsPerInput,
			r.RequestsPerSec, ratio, r.P50ms, r.P99ms, r.MsgsPerRequest, r.WorkerCPUms, serverCPU, r.Errors, r.Skipped)
	}
	tw.Flush()
}
