package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/spf13/cobra"
)

type demoConfig struct {
	requests, unique, replicas, concurrency, encodeMS int
	zipf, embedMB                                     float64
	seed                                              uint64
	json, verbose                                     bool
}

// pathStats summarises the requests one path answered.
type pathStats struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
}

// demoReport is what demo prints (as a table, or with --json as one object).
type demoReport struct {
	Requests        int                  `json:"requests"`
	UniqueInputs    int                  `json:"unique_inputs"`
	Replicas        int                  `json:"replicas"`
	EmbedMB         float64              `json:"embed_mb"`
	EncodeMS        int                  `json:"encode_ms"`
	EncoderForwards int                  `json:"encoder_forwards"`
	ForwardsOK      bool                 `json:"forwards_equal_unique_inputs"`
	Paths           map[string]pathStats `json:"paths"`
	BytesMoved      int64                `json:"bytes_moved"`
	Seconds         float64              `json:"seconds"`
	Baseline        struct {
		EncoderForwards int     `json:"encoder_forwards"`
		Seconds         float64 `json:"seconds"`
	} `json:"baseline_no_cache"`
	Speedup float64 `json:"speedup"`
	Note    string  `json:"note"`
}

func newDemo() *cobra.Command {
	var c demoConfig
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole thing on this machine and show what the cache saves",
		Long: "demo starts an embedded NATS server (JetStream, in a temporary directory), a reconciler,\n" +
			"one encoder worker and --replicas prefill workers as separate processes, and sends a Zipf\n" +
			"workload of real JPEG inputs through them: each request is encoded by the encoder stage and\n" +
			"then needed by a prefill replica. It runs the same workload with the cache off and prints\n" +
			"encoder forwards, hits by path, latencies, bytes moved, and the speedup.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case c.requests < 1, c.unique < 1, c.unique > c.requests:
				return usagef("need 1 <= --unique <= --requests (got %d and %d)", c.unique, c.requests)
			case c.replicas < 1 || c.replicas > 64:
				return usagef("--replicas must be 1..64, got %d", c.replicas)
			case c.concurrency < 1:
				return usagef("--concurrency must be >= 1")
			case c.embedMB <= 0 || c.embedMB > 512:
				return usagef("--embed-mb must be in (0, 512], got %v", c.embedMB)
			case c.zipf <= 1:
				return usagef("--zipf must be > 1, got %v", c.zipf)
			}
			report, err := runDemo(cmd.Context(), c, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if c.json {
				return writeJSON(cmd.OutOrStdout(), report)
			}
			printReport(cmd.OutOrStdout(), report)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.requests, "requests", 200, "requests to send")
	f.IntVar(&c.unique, "unique", 40, "distinct inputs among them")
	f.Float64Var(&c.zipf, "zipf", 1.1, "Zipf exponent of input popularity (> 1)")
	f.IntVar(&c.replicas, "replicas", 4, "prefill worker processes")
	f.IntVar(&c.concurrency, "concurrency", 8, "requests in flight")
	f.Float64Var(&c.embedMB, "embed-mb", 8, "embedding size in MiB")
	f.IntVar(&c.encodeMS, "encode-ms", 30, "milliseconds each forward waits, standing for GPU time")
	f.Uint64Var(&c.seed, "seed", 1, "workload seed")
	f.BoolVar(&c.json, "json", false, "print the report as one JSON object")
	f.BoolVarP(&c.verbose, "verbose", "v", false, "show the workers' logs")
	return cmd
}

// proc is a worker process driven over JSON lines.
type proc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	mu      sync.Mutex
	pending map[int]chan json.RawMessage
	stats   chan json.RawMessage
	exited  chan struct{}
}

func startWorker(exe string, args []string, logs io.Writer) (*proc, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stderr = logs
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, stdin: stdin, pending: map[int]chan json.RawMessage{}, stats: make(chan json.RawMessage, 1), exited: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		first := true
		for sc.Scan() {
			line := append(json.RawMessage(nil), sc.Bytes()...)
			if first {
				first = false
				close(ready)
				continue
			}
			var head struct {
				ID   *int   `json:"id"`
				Role string `json:"role"`
			}
			json.Unmarshal(line, &head)
			if head.ID == nil { // stats
				p.stats <- line
				continue
			}
			p.mu.Lock()
			ch := p.pending[*head.ID]
			delete(p.pending, *head.ID)
			p.mu.Unlock()
			if ch != nil {
				ch <- line
			}
		}
		cmd.Wait()
	}()
	select {
	case <-ready:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("worker %v exited before it was ready", args)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		return nil, fmt.Errorf("worker %v not ready in 30s", args)
	}
}

func (p *proc) call(r workRequest) (workResult, error) {
	ch := make(chan json.RawMessage, 1)
	p.mu.Lock()
	p.pending[r.ID] = ch
	line, _ := json.Marshal(r)
	_, err := p.stdin.Write(append(line, '\n'))
	p.mu.Unlock()
	if err != nil {
		return workResult{}, err
	}
	select {
	case raw := <-ch:
		var res workResult
		if err := json.Unmarshal(raw, &res); err != nil {
			return res, err
		}
		if res.Err != "" {
			return res, errors.New(res.Err)
		}
		return res, nil
	case <-p.exited:
		return workResult{}, errors.New("worker exited")
	}
}

func (p *proc) workerStats() (workerStats, error) {
	var s workerStats
	p.mu.Lock()
	_, err := p.stdin.Write([]byte(`{"id":-1}` + "\n"))
	p.mu.Unlock()
	if err != nil {
		return s, err
	}
	select {
	case raw := <-p.stats:
		return s, json.Unmarshal(raw, &s)
	case <-time.After(30 * time.Second):
		return s, errors.New("worker stats timed out")
	}
}

func (p *proc) stop() {
	p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

func runDemo(ctx context.Context, c demoConfig, progress io.Writer) (*demoReport, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "embcache-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	shmDir := filepath.Join(dir, "shm")
	if d, err := os.MkdirTemp("/dev/shm", "embcache-demo-"); err == nil { // tmpfs when the machine has it
		shmDir = d
		defer os.RemoveAll(d)
	}
	fmt.Fprintf(progress, "embcache demo: embedded NATS + reconciler + 1 encoder + %d prefill workers (processes)\n", c.replicas)
	srv, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(dir, "nats")})
	if err != nil {
		return nil, err
	}
	defer srv.Shutdown()

	store, err := shm.Open(shmDir, shm.WithNode("demo"))
	if err != nil {
		return nil, err
	}
	rnc, err := srv.Connect()
	if err != nil {
		return nil, err
	}
	defer rnc.Close()
	rec, err := coordinator.NewReconciler(rnc, coordinator.WithNode("demo"), coordinator.WithTransport(payload.TransportShm, store),
		coordinator.WithLogger(newLogger(io.Discard, false)))
	if err != nil {
		return nil, err
	}
	rctx, stopRec := context.WithCancel(ctx)
	recDone := make(chan struct{})
	go func() { rec.Run(rctx); close(recDone) }()
	defer func() { stopRec(); <-recDone }()

	logs := io.Discard
	if c.verbose {
		logs = progress
	}
	common := []string{"worker", "--nats", srv.ClientURL(), "--shm-dir", shmDir, "--node", "demo",
		"--embed-mb", strconv.FormatFloat(c.embedMB, 'f', -1, 64), "--encode-ms", strconv.Itoa(c.encodeMS)}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for i := 0; i <= c.replicas; i++ {
		role := "prefill"
		if i == 0 {
			role = "encoder"
		}
		p, err := startWorker(exe, append(slices.Clone(common), "--role", role), logs)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	encoder, prefills := procs[0], procs[1:]
	workloadIdx := workload.Requests(c.requests, c.unique, c.zipf, c.seed)

	report := &demoReport{Requests: c.requests, UniqueInputs: c.unique, Replicas: c.replicas, EmbedMB: c.embedMB,
		EncodeMS: c.encodeMS, Paths: map[string]pathStats{},
		Note: fmt.Sprintf("the encoder is a stand-in: it decodes each JPEG and expands its pixels into a %.0f MiB tensor (real CPU work), then waits %d ms standing for GPU time; forwards are serialised as on one GPU", c.embedMB, c.encodeMS)}

	// With the cache: the encoder stage, then a prefill replica, per request.
	latencies := map[string][]float64{}
	var mu sync.Mutex
	start := time.Now()
	err = drive(workloadIdx, c.concurrency, progress, "cache on ", func(id, image int) error {
		for _, p := range []*proc{encoder, prefills[id%len(prefills)]} {
			res, err := p.call(workRequest{ID: id, Image: image, Cache: true})
			if err != nil {
				return err
			}
			mu.Lock()
			latencies[res.Path] = append(latencies[res.Path], res.Millis)
			report.BytesMoved += res.Bytes
			if res.Forward {
				report.EncoderForwards++
			}
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	report.Seconds = time.Since(start).Seconds()

	// The baseline: the encoder encodes every request.
	start = time.Now()
	err = drive(workloadIdx, c.concurrency, progress, "cache off", func(id, image int) error {
		_, err := encoder.call(workRequest{ID: c.requests + id, Image: image, Cache: false})
		return err
	})
	if err != nil {
		return nil, err
	}
	report.Baseline.Seconds = time.Since(start).Seconds()
	report.Baseline.EncoderForwards = c.requests

	// The workers' own count of forwards, to check the drivers'.
	total := 0
	for _, p := range procs {
		s, err := p.workerStats()
		if err != nil {
			return nil, err
		}
		total += s.Forwards
	}
	if total != report.EncoderForwards+report.Baseline.EncoderForwards {
		return nil, fmt.Errorf("workers counted %d forwards, the driver %d", total, report.EncoderForwards+report.Baseline.EncoderForwards)
	}
	for path, ls := range latencies {
		slices.Sort(ls)
		report.Paths[path] = pathStats{Count: len(ls), P50: ls[len(ls)/2], P99: ls[min(len(ls)-1, len(ls)*99/100)]}
	}
	report.ForwardsOK = report.EncoderForwards == c.unique
	report.Speedup = report.Baseline.Seconds / report.Seconds
	return report, nil
}

// speedupText says how much faster the cache made the run, or how much
// slower (a ratio under 1 is not "0.8x faster").
func speedupText(ratio float64) string {
	if ratio >= 1 || ratio <= 0 {
		return fmt.Sprintf("%.1fx faster", ratio)
	}
	return fmt.Sprintf("%.1fx slower", 1/ratio)
}

// isTerminal reports whether w is a terminal, where a progress bar may be
// redrawn in place; in a log file it would be a line of carriage returns.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// drive runs fn for every request, concurrency at a time, with a progress
// bar on a terminal (a line when done, elsewhere).
func drive(images []int, concurrency int, progress io.Writer, label string, fn func(id, image int) error) error {
	bar := isTerminal(progress)
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	done := 0
	for id, image := range images {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := fn(id, image)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("request %d (input %d): %w", id, image, err)
			}
			done++
			if bar && (done%max(1, len(images)/40) == 0 || done == len(images)) {
				fmt.Fprintf(progress, "\r%s [%-40s] %d/%d", label, strings.Repeat("#", 40*done/len(images)), done, len(images))
			}
		})
	}
	wg.Wait()
	if bar {
		fmt.Fprintln(progress)
	} else {
		fmt.Fprintf(progress, "%s: %d/%d requests\n", label, done, len(images))
	}
	return firstErr
}

func printReport(w io.Writer, r *demoReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "requests\t%d\n", r.Requests)
	fmt.Fprintf(tw, "unique inputs\t%d\n", r.UniqueInputs)
	ok := "== unique inputs"
	if !r.ForwardsOK {
		ok = "!= unique inputs"
	}
	fmt.Fprintf(tw, "encoder forwards\t%d\t(%s; %d without the cache)\n", r.EncoderForwards, ok, r.Baseline.EncoderForwards)
	fmt.Fprintf(tw, "bytes moved\t%.1f MiB\t(remote pulls; shm maps, it does not copy)\n", float64(r.BytesMoved)/(1<<20))
	fmt.Fprintf(tw, "wall time\t%.2fs\t(%.2fs without the cache: %s)\n", r.Seconds, r.Baseline.Seconds, speedupText(r.Speedup))
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "path\tcount\tp50 ms\tp99 ms")
	names := make([]string, 0, len(r.Paths))
	for name := range r.Paths {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		p := r.Paths[name]
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\n", name, p.Count, p.P50, p.P99)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "note:", r.Note)
}
