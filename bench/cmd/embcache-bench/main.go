// Command embcache-bench measures embcache: its hot paths against their
// floors (key construction, a local hit, the coordinator's cluster-wide
// miss and wake, payload gets) and the dedup workload against peers (no
// cache, in-process only, a Redis single-flight, groupcache, embcache) in
// real processes. It lives in a module of its own so that the peers'
// dependencies (go-redis, groupcache) stay out of the library's go.mod and
// the embcache binary. `make bench` builds and runs it.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// Exit codes: 0 success, 1 failure, 2 bad usage or input.
const (
	exitFailure = 1
	exitUsage   = 2
)

// usageError marks an error as the caller's: exit code 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "embcache-bench:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(exitUsage)
		}
		os.Exit(exitFailure)
	}
}

func newRoot() *cobra.Command {
	var suites, out string
	var quick bool
	var wf workloadFlags
	var sf scaleFlags
	cmd := &cobra.Command{
		Use:   "embcache-bench",
		Short: "Measure the hot paths against their floors, and the dedup workload against peers, in one run",
		Long: "embcache-bench runs suites and prints tables (and, with --out, JSON). Each hot-path case\n" +
			"is measured alternately with its baseline in the same process. Suites: keys (key construction\n" +
			"vs bare BLAKE3 and SHA-256), local (a local hit vs a bare golang-lru Get, 1 and 2 goroutines),\n" +
			"coord (a cluster-wide miss and a waiter's wake vs bare KV CAS and put->watch; R1 and R3,\n" +
			"SyncAlways on and off), payload (shm and httppull get vs memcpy and bare loopback TCP),\n" +
			"workload (P processes x C goroutines over Zipf inputs: no cache, in-process only, a Redis\n" +
			"single-flight, groupcache, embcache R1, R3, R1 over shm and R1 over a real Mooncake Store (a\n" +
			"binary built with -tags mooncake, make build-bench-mooncake); redis-server must be on PATH),\n" +
			"scale (NATS messages per request and per forward of embcache R1 for 2 to 32 processes; with\n" +
			"10^4..10^6 committed records: a new process's time to its first hit, the reconciler's heap and\n" +
			"start, stats and leases ls).",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			run := map[string]func(bool) ([]benchRow, error){"keys": benchKeys, "local": benchLocal, "coord": benchCoord, "payload": benchPayload}
			names := strings.Split(suites, ",")
			for _, s := range names {
				if _, ok := run[s]; !ok && s != "workload" && s != "scale" {
					return usagef("unknown suite %q (keys, local, coord, payload, workload, scale)", s)
				}
			}
			wf, err := wf.validate(quick)
			if err != nil {
				return err
			}
			var rows []benchRow
			var work []workloadRow
			var scale scaleResult
			for _, s := range names {
				if s == "scale" {
					if scale, err = benchScale(cmd.Context(), sf, quick, cmd.ErrOrStderr()); err != nil {
						return fmt.Errorf("suite scale: %w", err)
					}
					continue
				}
				if s == "workload" {
					if work, err = benchWorkload(cmd.Context(), wf, cmd.ErrOrStderr()); err != nil {
						return fmt.Errorf("suite workload: %w", err)
					}
					continue
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "%s ...\n", s)
				r, err := run[s](quick)
				if err != nil {
					return fmt.Errorf("suite %s: %w", s, err)
				}
				rows = append(rows, r...)
			}
			if len(rows) > 0 {
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "suite\tcase\tours\tbaseline\tunit\tratio\tnote")
				for _, r := range rows {
					fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.3f\t%s\t%.3fx\t%s\n", r.Suite, r.Case, r.Ours, r.Baseline, r.Unit, r.Ratio, r.Note)
				}
				tw.Flush()
			}
			if len(work) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "\nworkload: %d processes x %d goroutines, %d requests over %d inputs (Zipf %.2f), encoder %d ms + decode, %.2f MiB embeddings\n",
					wf.procs, wf.goroutines, wf.requests, wf.unique, wf.zipf, wf.encodeMS, wf.embedMB)
				printWorkload(cmd.OutOrStdout(), work)
			}
			if len(scale.Processes) > 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "\nscale: embcache R1, 2 goroutines a process, 16 KiB values, 1 ms encoder")
				printScale(cmd.OutOrStdout(), scale.Processes)
			}
			if len(scale.Shards) > 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "\nscale: misses of embcache R3 on a 3-node embedded cluster, 4 processes x 4 goroutines, 16 KiB values, no encoder time")
				printShards(cmd.OutOrStdout(), scale.Shards)
			}
			if len(scale.Records) > 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "\nscale: committed records (each process measured is a new one; records written with SyncAlways off)")
				printRecords(cmd.OutOrStdout(), scale.Records)
			}
			if out != "" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				return writeJSON(f, map[string]any{"machine": benchMachine(), "rows": rows, "workload": work, "scale": scale, "workload_config": map[string]any{
					"procs": wf.procs, "goroutines": wf.goroutines, "unique": wf.unique, "requests": wf.requests,
					"zipf": wf.zipf, "encode_ms": wf.encodeMS, "embed_mb": wf.embedMB}})
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&suites, "suites", "keys,local,coord,payload,workload", "suites to run, comma-separated")
	cmd.Flags().StringVar(&out, "out", "", "also write the results as JSON to this file")
	cmd.Flags().BoolVar(&quick, "quick", false, "small sizes and few rounds (a smoke run)")
	wf.register(cmd.Flags())
	sf.register(cmd.Flags())
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.AddCommand(newWorker())
	cmd.AddCommand(newRecordsChildren()...)
	return cmd
}

func benchMachine() map[string]any {
	host, _ := os.Hostname()
	return map[string]any{"host": host, "time": time.Now().UTC().Format(time.RFC3339)}
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func writeJSONLine(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }
