package demo

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/live"
	"github.com/embcache/embcache/node"
)

// Config is one demo run; cmd/embcache checks the ranges of its flags.
type Config struct {
	Exe         string // the embcache binary whose worker command runs the stages (default: this process's)
	Requests    int    // requests to send
	Unique      int    // distinct inputs among them
	Zipf        float64
	Replicas    int // prefill worker processes
	Concurrency int // requests in flight
	EmbedMB     float64
	EncodeMS    int    // milliseconds a forward waits, standing for GPU time
	Seed        uint64 // of the workload
	Verbose     bool   // the workers' logs go to progress
	// ShmRoot is where the shm payload store's directory is made
	// (default /dev/shm, or the temporary directory where that fails).
	ShmRoot string
	// LiveListen is where the live view's page is served during the run
	// (default 127.0.0.1:0); the demo prints its URL and the embcache top
	// command that shows the same.
	LiveListen string
	// Hold keeps the cluster up after the measured runs, sending the
	// workload again (new inputs each round) until ctx ends, so that the
	// page and embcache top can be watched; Show is called with the
	// report first.
	Hold bool
	Show func(*Report)
}

// PathStats summarises the requests one path answered.
type PathStats struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
}

// Report is what a run measured (embcache demo prints it as a table, or
// with --json as it is).
type Report struct {
	Requests        int                  `json:"requests"`
	UniqueInputs    int                  `json:"unique_inputs"`
	Replicas        int                  `json:"replicas"`
	EmbedMB         float64              `json:"embed_mb"`
	EncodeMS        int                  `json:"encode_ms"`
	EncoderForwards int                  `json:"encoder_forwards"`
	ForwardsOK      bool                 `json:"forwards_equal_unique_inputs"`
	Paths           map[string]PathStats `json:"paths"`
	BytesMoved      int64                `json:"bytes_moved"`
	Seconds         float64              `json:"seconds"`
	Baseline        struct {
		EncoderForwards int     `json:"encoder_forwards"`
		Seconds         float64 `json:"seconds"`
	} `json:"baseline_no_cache"`
	Speedup float64 `json:"speedup"`
	Note    string  `json:"note"`
}

// Run starts an embedded NATS server, a reconciler node, one encoder and
// c.Replicas prefill worker processes, sends the workload through them with
// the cache on and then off, and reports. Progress lines go to progress.
// It first removes what demos killed before left behind (workDirs); the
// workers die with it (on Linux).
func Run(ctx context.Context, c Config, progress io.Writer) (*Report, error) {
	if c.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		c.Exe = exe
	}
	removeStaleWorkDirs(cmp.Or(c.ShmRoot, defaultShmRoot), progress)
	dirs, err := makeWorkDirs(c.ShmRoot)
	if err != nil {
		return nil, err
	}
	defer dirs.remove()
	fmt.Fprintf(progress, "embcache demo: embedded NATS + reconciler + 1 encoder + %d prefill workers (processes)\n", c.Replicas)
	srv, err := embedded.Start(embedded.Options{StoreDir: dirs.nats})
	if err != nil {
		return nil, err
	}
	defer srv.Shutdown()
	rec, err := node.New(node.Options{NATSURL: srv.ClientURL(), Name: "demo", ShmDir: dirs.shm, NoCache: true, Reconciler: true,
		Role: live.RoleServe, SummaryInterval: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	if err := rec.Start(ctx); err != nil {
		return nil, err
	}
	defer rec.Close()
	stopLive, err := serveLive(c, srv.ClientURL(), progress)
	if err != nil {
		return nil, err
	}
	defer stopLive()
	procs, err := startWorkers(c, srv.ClientURL(), dirs, progress)
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	if err != nil {
		return nil, err
	}
	r, err := measure(c, procs, progress)
	if err != nil || !c.Hold {
		return r, err
	}
	if c.Show != nil {
		c.Show(r)
	}
	return r, hold(ctx, c, procs, progress)
}

// startWorkers starts the encoder (first) and the prefill workers, each
// holding the locks of the demo's directories with it; on error, those it
// started are returned too, to be stopped.
func startWorkers(c Config, url string, dirs *workDirs, progress io.Writer) ([]*proc, error) {
	logs := io.Discard
	if c.Verbose {
		logs = progress
	}
	common := []string{"worker", "--nats", url, "--shm-dir", dirs.shm, "--node", "demo", "--summary-interval", "1s",
		"--embed-mb", strconv.FormatFloat(c.EmbedMB, 'f', -1, 64), "--encode-ms", strconv.Itoa(c.EncodeMS)}
	var procs []*proc
	for i := 0; i <= c.Replicas; i++ {
		role := "prefill"
		if i == 0 {
			role = "encoder"
		}
		p, err := startProc(c.Exe, append(slices.Clone(common), "--role", role), logs, dirs.locks)
		if err != nil {
			return procs, err
		}
		procs = append(procs, p)
	}
	return procs, nil
}

// measure sends the workload with the cache on (the encoder stage, then a
// prefill replica, per request) and off (the encoder encodes every request),
// and checks the drivers' count of forwards against the workers' own.
func measure(c Config, procs []*proc, progress io.Writer) (*Report, error) {
	encoder, prefills := procs[0], procs[1:]
	images := workload.Requests(c.Requests, c.Unique, c.Zipf, c.Seed)
	r := &Report{Requests: c.Requests, UniqueInputs: c.Unique, Replicas: c.Replicas, EmbedMB: c.EmbedMB,
		EncodeMS: c.EncodeMS, Paths: map[string]PathStats{},
		Note: fmt.Sprintf("the encoder is a stand-in: it decodes each JPEG and expands its pixels into a %.0f MiB tensor (real CPU work), then waits %d ms standing for GPU time; forwards are serialised as on one GPU", c.EmbedMB, c.EncodeMS)}
	latencies := map[string][]float64{}
	var mu sync.Mutex
	start := time.Now()
	err := drive(images, c.Concurrency, progress, "cache on ", func(id, image int) error {
		for _, p := range []*proc{encoder, prefills[id%len(prefills)]} {
			res, err := p.call(Request{ID: id, Image: image, Cache: true})
			if err != nil {
				return err
			}
			mu.Lock()
			latencies[res.Path] = append(latencies[res.Path], res.Millis)
			r.BytesMoved += res.Bytes
			if res.Forward {
				r.EncoderForwards++
			}
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.Seconds = time.Since(start).Seconds()
	start = time.Now()
	err = drive(images, c.Concurrency, progress, "cache off", func(id, image int) error {
		_, err := encoder.call(Request{ID: c.Requests + id, Image: image, Cache: false})
		return err
	})
	if err != nil {
		return nil, err
	}
	r.Baseline.Seconds, r.Baseline.EncoderForwards = time.Since(start).Seconds(), c.Requests
	return r, r.finish(procs, latencies)
}

// finish checks the forwards against the workers' own count and sums up.
func (r *Report) finish(procs []*proc, latencies map[string][]float64) error {
	total := 0
	for _, p := range procs {
		s, err := p.workerStats()
		if err != nil {
			return err
		}
		total += s.Forwards
	}
	if want := r.EncoderForwards + r.Baseline.EncoderForwards; total != want {
		return fmt.Errorf("workers counted %d forwards, the driver %d", total, want)
	}
	for path, ls := range latencies {
		slices.Sort(ls)
		r.Paths[path] = PathStats{Count: len(ls), P50: ls[len(ls)/2], P99: ls[min(len(ls)-1, len(ls)*99/100)]}
	}
	r.ForwardsOK = r.EncoderForwards == r.UniqueInputs
	r.Speedup = r.Baseline.Seconds / r.Seconds
	return nil
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
