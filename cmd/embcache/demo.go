package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"text/tabwriter"

	"github.com/embcache/embcache/cmd/embcache/internal/demo"
	"github.com/spf13/cobra"
)

func newDemo() *cobra.Command {
	var c demo.Config
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole thing on this machine and show what the cache saves",
		Long: "demo starts an embedded NATS server (JetStream, in a temporary directory), a reconciler,\n" +
			"one encoder worker and --replicas prefill workers as separate processes, and sends a Zipf\n" +
			"workload of real JPEG inputs through them: each request is encoded by the encoder stage and\n" +
			"then needed by a prefill replica. It runs the same workload with the cache off and prints\n" +
			"encoder forwards, hits by path, latencies, bytes moved, and the speedup.\n\n" +
			"Its files are in a directory in /dev/shm (--shm-root) and one in the temporary directory,\n" +
			"removed when it ends; its workers die with it. A demo killed with SIGKILL leaves its\n" +
			"directories: the next demo removes them (those of demos still running it leaves alone).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case c.Requests < 1, c.Unique < 1, c.Unique > c.Requests:
				return usagef("need 1 <= --unique <= --requests (got %d and %d)", c.Unique, c.Requests)
			case c.Replicas < 1 || c.Replicas > 64:
				return usagef("--replicas must be 1..64, got %d", c.Replicas)
			case c.Concurrency < 1:
				return usagef("--concurrency must be >= 1")
			case c.EmbedMB <= 0 || c.EmbedMB > 512:
				return usagef("--embed-mb must be in (0, 512], got %v", c.EmbedMB)
			case c.Zipf <= 1:
				return usagef("--zipf must be > 1, got %v", c.Zipf)
			case c.EncodeMS < 0:
				return usagef("--encode-ms must be >= 0, got %d", c.EncodeMS)
			}
			show := func(r *demo.Report) error {
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), r)
				}
				printReport(cmd.OutOrStdout(), r)
				return nil
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			var showErr error
			c.Show = func(r *demo.Report) { showErr = show(r) }
			report, err := demo.Run(ctx, c, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if c.Hold {
				return showErr // shown before the hold
			}
			if err := show(report); err != nil || asJSON {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "\nto watch the cluster work live, in a browser or with embcache top: make demo-live (demo --hold)")
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.Requests, "requests", 200, "requests to send")
	f.IntVar(&c.Unique, "unique", 40, "distinct inputs among them")
	f.Float64Var(&c.Zipf, "zipf", 1.1, "Zipf exponent of input popularity (> 1)")
	f.IntVar(&c.Replicas, "replicas", 4, "prefill worker processes")
	f.IntVar(&c.Concurrency, "concurrency", 8, "requests in flight")
	f.Float64Var(&c.EmbedMB, "embed-mb", 8, "embedding size in MiB")
	f.IntVar(&c.EncodeMS, "encode-ms", 30, "milliseconds each forward waits, standing for GPU time")
	f.Uint64Var(&c.Seed, "seed", 1, "workload seed")
	f.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	f.BoolVarP(&c.Verbose, "verbose", "v", false, "show the workers' logs")
	f.BoolVar(&c.Hold, "hold", false, "after the report, keep the cluster up and the workload going (new inputs each round) until Ctrl-C: watch it at the page or with embcache top, as printed")
	f.StringVar(&c.ShmRoot, "shm-root", "", "where the payload store's directory is made (default /dev/shm); a directory there left by a demo that was killed is removed")
	f.StringVar(&c.LiveListen, "live-listen", "127.0.0.1:0", "where the live view's page is served while the demo runs")
	return cmd
}

// speedupText says how much faster the cache made the run, or how much
// slower (a ratio under 1 is not "0.8x faster").
func speedupText(ratio float64) string {
	if ratio >= 1 || ratio <= 0 {
		return fmt.Sprintf("%.1fx faster", ratio)
	}
	return fmt.Sprintf("%.1fx slower", 1/ratio)
}

func printReport(w io.Writer, r *demo.Report) {
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
	for _, name := range slices.Sorted(maps.Keys(r.Paths)) {
		p := r.Paths[name]
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\n", name, p.Count, p.P50, p.P99)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "note:", r.Note)
}
