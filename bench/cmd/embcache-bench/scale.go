package main

import (
	"context"
	"fmt"
	"io"
	"os"
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
	records          string
}

func (s *scaleFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&s.procs, "scale-procs", "2,4,8,16,32", "scale: process counts, comma-separated")
	fs.IntVar(&s.requests, "scale-requests", 4000, "scale: requests in all, per process count")
	fs.IntVar(&s.unique, "scale-unique", 4000, "scale: unique inputs (Zipf 1.1)")
	fs.StringVar(&s.records, "scale-records", "10000,100000,1000000", "scale: committed record counts for the join, reconciler and inspection figures, comma-separated (empty: none)")
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

func (s scaleFlags) counts(quick bool) (procs, records []int, _ scaleFlags, _ error) {
	if quick {
		s.procs, s.requests, s.unique, s.records = "2,4", 80, 40, "1000"
	}
	procs, err := parseCounts("scale-procs", s.procs)
	if err != nil {
		return nil, nil, s, err
	}
	if records, err = parseCounts("scale-records", s.records); err != nil {
		return nil, nil, s, err
	}
	if s.unique < 1 || s.requests < s.unique {
		return nil, nil, s, usagef("scale: need unique >= 1 and requests >= unique")
	}
	return procs, records, s, nil
}

// scaleResult is the scale suite's figures.
type scaleResult struct {
	Processes []scaleRow   `json:"processes"`
	Records   []recordsRow `json:"records"`
}

func benchScale(ctx context.Context, sf scaleFlags, quick bool, log io.Writer) (scaleResult, error) {
	var res scaleResult
	counts, records, sf, err := sf.counts(quick)
	if err != nil {
		return res, err
	}
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	for _, p := range counts {
		fmt.Fprintf(log, "scale: %d processes ...\n", p)
		wf := workloadFlags{procs: p, goroutines: 2, unique: sf.unique, requests: sf.requests, zipf: 1.1,
			encodeMS: 1, embedMB: 1.0 / 64, systems: sysEmbcache, rounds: 1}
		w, err := runSystem(ctx, self, sysEmbcache, wf)
		if err != nil {
			return res, fmt.Errorf("%d processes: %w", p, err)
		}
		row := scaleRow{Procs: p, Requests: w.Requests, Forwards: w.Forwards, MsgsPerRequest: w.MsgsPerRequest,
			DeliveredPerRequest: w.DeliveredPerRequest, RequestsPerSec: w.RequestsPerSec, Errors: w.Errors}
		if w.Forwards > 0 {
			perForward := float64(w.Requests) / float64(w.Forwards)
			row.MsgsPerForward = w.MsgsPerRequest * perForward
			row.DeliveredPerForward = w.DeliveredPerRequest * perForward
		}
		res.Processes = append(res.Processes, row)
	}
	res.Records, err = benchRecords(ctx, records, log)
	return res, err
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
