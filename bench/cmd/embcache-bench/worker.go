package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/payload"
	"github.com/spf13/cobra"
)

// startCPUProfile profiles this process's CPU into path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// newWorker is the hidden command the workload suite runs per process.
func newWorker() *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use:    "worker",
		Short:  "One process of the bench's workload suite (run by embcache-bench)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg dedupConfig
			if err := json.Unmarshal([]byte(config), &cfg); err != nil {
				return usagef("bad --config: %v", err)
			}
			return runBenchWorker(cmd.Context(), cfg, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "the process's JSON config")
	return cmd
}

func runBenchWorker(ctx context.Context, cfg dedupConfig, in io.Reader, out, errw io.Writer) error {
	keyer, err := cachekey.NewKeyer(workload.Config("bench"))
	if err != nil {
		return err
	}
	enc := &workload.Encoder{Bytes: cfg.EmbedBytes, Wait: time.Duration(cfg.EncodeMS) * time.Millisecond}
	inputs := make([][]byte, cfg.Unique)
	keys := make([]cachekey.Key, cfg.Unique)
	byKey := make(map[string]int, cfg.Unique)
	for i := range inputs {
		inputs[i] = workload.Image(i)
		if keys[i], err = keyer.RawBytes(inputs[i]); err != nil {
			return err
		}
		byKey[keys[i].String()] = i
	}
	computeOf := func(key string) (computeFunc, bool) {
		i, ok := byKey[key]
		return func(ctx context.Context) (*payload.Value, error) { return enc.Encode(ctx, inputs[i]) }, ok
	}
	sys, err := openSystem(ctx, cfg, newLogger(errw), computeOf)
	if err != nil {
		return err
	}
	defer sys.close()
	var mine []int
	for i, in := range workload.Requests(cfg.Requests, cfg.Unique, cfg.Zipf, cfg.Seed) {
		if i%cfg.Procs == cfg.Proc {
			mine = append(mine, in)
		}
	}
	writeJSONLine(out, map[string]bool{"ready": true})
	control := bufio.NewReader(in)
	if _, err := control.ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for go: %w", err)
	}
	if dir := os.Getenv(cpuProfileEnv); dir != "" {
		stop, err := startCPUProfile(filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", cfg.System, cfg.Proc)))
		if err != nil {
			return err
		}
		defer stop()
	}
	m0, d0 := sys.messages(), deliveredOf(sys)
	cpu0, cpuErr := selfCPU()
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range mine {
			next <- i
		}
	}()
	var mu sync.Mutex
	res := dedupResult{Requests: len(mine), Latencies: make([]int64, 0, len(mine))}
	want := int64(cfg.EmbedBytes / 4 * 4)
	var wg sync.WaitGroup
	for range cfg.Goroutines {
		wg.Go(func() {
			for i := range next {
				input := mine[i]
				req := fmt.Sprintf("p%d-r%d", cfg.Proc, i)
				fn, _ := computeOf(keys[input].String())
				t0 := time.Now()
				v, release, err := sys.get(ctx, req, keys[input], fn)
				if err == nil && int64(len(v.Tensor.Data)) != want {
					err = fmt.Errorf("input %d: %d bytes, want %d", input, len(v.Tensor.Data), want)
				}
				d := time.Since(t0)
				if release != nil {
					release()
				}
				mu.Lock()
				res.Latencies = append(res.Latencies, d.Microseconds())
				if err != nil {
					if res.Errors++; res.FirstErr == "" {
						res.FirstErr = err.Error()
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if cpu1, err := selfCPU(); err == nil && cpuErr == nil {
		res.CPUms = float64(cpu1-cpu0) / float64(time.Millisecond)
	}
	if err := writeJSONLine(out, res); err != nil {
		return err
	}
	// Serve the others (their pulls; groupcache's fills of the keys this
	// process owns) until every process is done, then report what this
	// process did for everyone, and wait for stdin to close.
	if _, err := control.ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for report: %w", err)
	}
	res = dedupResult{Forwards: enc.Forwards(), Messages: sys.messages() - m0, Delivered: deliveredOf(sys) - d0, Detail: sys.detail()}
	if err := writeJSONLine(out, res); err != nil {
		return err
	}
	io.Copy(io.Discard, control)
	return nil
}
