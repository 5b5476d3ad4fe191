package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"
)

// The scale suite (issue 17): how the NATS traffic of embcache R1 grows
// with the number of processes. Each process is a real one (the workload
// suite's workers), the values are small (16 KiB) and the encoder fast, so
// the messages, not the CPU, are what is measured.

// scaleFlags size the scale suite.
type scaleFlags struct {
	procs            string
	requests, unique int
}

func (s *scaleFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&s.procs, "scale-procs", "2,4,8,16,32", "scale: process counts, comma-separated")
	fs.IntVar(&s.requests, "scale-requests", 4000, "scale: requests in all, per process count")
	fs.IntVar(&s.unique, "scale-unique", 4000, "scale: unique inputs (Zipf 1.1)")
}

// scaleRow is one process count's run.
type scaleRow struct {
	Procs          int     `json:"procs"`
	Requests       int     `json:"requests"`
	Forwards       int     `json:"forwards"`
	MsgsPerRequest float64 `json:"messages_per_request"`
	MsgsPerForward float64 `json:"messages_per_forward"`
	// Delivered counts only the messages delivered to the processes.
	DeliveredPerRequest float64 `json:"delivered_per_request"`
	DeliveredPerForward float64 `json:"delivered_per_forward"`
	RequestsPerSec      float64 `json:"requests_per_s"`
	Errors              int     `json:"errors"`
}

func (s scaleFlags) counts(quick bool) ([]int, scaleFlags, error) {
	if quick {
		s.procs, s.requests, s.unique = "2,4", 80, 40
	}
	var counts []int
	for _, p := range strings.Split(s.procs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			return nil, s, usagef("scale: --scale-procs %q: want process counts >= 1", s.procs)
		}
		counts = append(counts, n)
	}
	if s.unique < 1 || s.requests < s.unique {
		return nil, s, usagef("scale: need unique >= 1 and requests >= unique")
	}
	return counts, s, nil
}

func benchScale(ctx context.Context, sf scaleFlags, quick bool, log io.Writer) ([]scaleRow, error) {
	counts, sf, err := sf.counts(quick)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var rows []scaleRow
	for _, p := range counts {
		fmt.Fprintf(log, "scale: %d processes ...\n", p)
		wf := workloadFlags{procs: p, goroutines: 2, unique: sf.unique, requests: sf.requests, zipf: 1.1,
			encodeMS: 1, embedMB: 1.0 / 64, systems: sysEmbcache, rounds: 1}
		w, err := runSystem(ctx, self, sysEmbcache, wf)
		if err != nil {
			return rows, fmt.Errorf("%d processes: %w", p, err)
		}
		row := scaleRow{Procs: p, Requests: w.Requests, Forwards: w.Forwards, MsgsPerRequest: w.MsgsPerRequest,
			DeliveredPerRequest: w.DeliveredPerRequest, RequestsPerSec: w.RequestsPerSec, Errors: w.Errors}
		if w.Forwards > 0 {
			perForward := float64(w.Requests) / float64(w.Forwards)
			row.MsgsPerForward = w.MsgsPerRequest * perForward
			row.DeliveredPerForward = w.DeliveredPerRequest * perForward
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func printScale(w io.Writer, rows []scaleRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "processes\trequests\tforwards\tNATS msgs/request\tmsgs/forward\tdelivered/request\tdelivered/forward\trequests/s\terrors")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%d\n", r.Procs, r.Requests, r.Forwards, r.MsgsPerRequest, r.MsgsPerForward,
			r.DeliveredPerRequest, r.DeliveredPerForward, r.RequestsPerSec, r.Errors)
	}
	tw.Flush()
}
