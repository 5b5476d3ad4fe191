package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/lease"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"
)

// The scale suite (issue 17): how the NATS traffic of embcache R1 grows
// with the number of processes, how misses scale with lease shards on a
// 3-node cluster, and what a million records cost (records.go). Each
// process is a real one (the workload suite's workers), the values are
// small (16 KiB) and the encoder fast, so the messages, not the CPU, are
// what is measured.

// scaleFlags size the scale suite.
type scaleFlags struct {
	procs            string
	requests, unique int
	records          string
	shards           string
	shardRequests    int
}

func (s *scaleFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&s.procs, "scale-procs", "2,4,8,16,32", "scale: process counts, comma-separated")
	fs.IntVar(&s.requests, "scale-requests", 4000, "scale: requests in all, per process count")
	fs.IntVar(&s.unique, "scale-unique", 4000, "scale: unique inputs (Zipf 1.1)")
	fs.StringVar(&s.shards, "scale-shards", "1,3", "scale: lease shard counts for the miss throughput on a 3-node cluster, comma-separated (empty: none)")
	fs.IntVar(&s.shardRequests, "scale-shard-requests", 2000, "scale: misses per shard count's run")
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
	// What the processes' Caches counted: how the requests were answered,
	// and the touched events they sent.
	LocalHits      uint64  `json:"local_hits"`
	RemoteHits     uint64  `json:"remote_hits"`
	Waits          uint64  `json:"waits"`
	Touches        uint64  `json:"touches"`
	RequestsPerSec float64 `json:"requests_per_s"`
	Errors         int     `json:"errors"`
}

func (s scaleFlags) counts(quick bool) (procs, records, shards []int, _ scaleFlags, _ error) {
	if quick {
		s.procs, s.requests, s.unique, s.records, s.shards, s.shardRequests = "2,4", 80, 40, "1000", "1,3", 80
	}
	procs, err := parseCounts("scale-procs", s.procs)
	if err != nil {
		return nil, nil, nil, s, err
	}
	if records, err = parseCounts("scale-records", s.records); err != nil {
		return nil, nil, nil, s, err
	}
	if shards, err = parseCounts("scale-shards", s.shards); err != nil {
		return nil, nil, nil, s, err
	}
	if s.unique < 1 || s.requests < s.unique || s.shardRequests < 1 {
		return nil, nil, nil, s, usagef("scale: need unique >= 1, requests >= unique and shard requests >= 1")
	}
	return procs, records, shards, s, nil
}

// shardRow is one shard count's miss throughput on a 3-node cluster: the
// median of three runs.
type shardRow struct {
	Shards       int       `json:"shards"`
	Procs        int       `json:"procs"`
	Misses       int       `json:"misses"`
	MissesPerSec float64   `json:"misses_per_s"`
	RunsPerSec   []float64 `json:"runs_misses_per_s"`
	P50ms        float64   `json:"p50_ms"`
	Leaders      []string  `json:"leaders"` // of each shard, in the median run
	Errors       int       `json:"errors"`
	// StreamCeiling is the floor measured in the same run: small messages
	// per second into one R3 stream (streamCeiling).
	StreamCeiling float64 `json:"stream_ceiling_msgs_per_s"`
}

// streamCeiling is the floor of the shards part: how many small
// messages one R3 stream (one Raft group, SyncAlways) on a new 3-node
// embedded cluster accepts per second from one process publishing
// asynchronously, 256 in flight.
func streamCeiling(ctx context.Context, n int) (float64, error) {
	dir, err := os.MkdirTemp("", "embcache-bench-ceiling-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	cl, err := embedded.StartCluster(ctx, 3, dir, nil)
	if err != nil {
		return 0, err
	}
	defer cl.Shutdown()
	nc, err := cl.Connect()
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		_, err = js.CreateStream(cctx, jetstream.StreamConfig{Name: "CEILING", Subjects: []string{"ceiling.>"},
			Storage: jetstream.FileStorage, Replicas: 3})
		if err == nil || cctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the meta leader is being elected
	}
	if err != nil {
		return 0, err
	}
	body := make([]byte, 300) // about a lease record's size
	start := time.Now()
	for i := range n {
		if _, err := js.PublishAsync("ceiling."+strconv.Itoa(i%1024), body, jetstream.WithStallWait(30*time.Second)); err != nil {
			return 0, err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-cctx.Done():
		return 0, cctx.Err()
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// benchShards measures misses (every request a new key, no encoder time)
// of embcache R3 on a 3-node embedded cluster with the lease bucket in
// each number of shards.
func benchShards(ctx context.Context, self string, shards []int, requests int, log io.Writer) ([]shardRow, error) {
	var rows []shardRow
	ceiling, err := streamCeiling(ctx, 10*requests)
	if err != nil {
		return nil, fmt.Errorf("stream ceiling: %w", err)
	}
	for _, k := range shards {
		fmt.Fprintf(log, "scale: %d lease shards on 3 nodes ...\n", k)
		wf := workloadFlags{procs: 4, goroutines: 4, unique: requests, requests: requests, zipf: 1.1,
			encodeMS: 0, embedMB: 1.0 / 64, systems: sysEmbcacheR3, rounds: 1, shards: k}
		var runs []workloadRow
		for range 3 {
			w, err := runSystem(ctx, self, sysEmbcacheR3, wf)
			if err != nil {
				return rows, fmt.Errorf("%d shards: %w", k, err)
			}
			runs = append(runs, w)
		}
		slices.SortFunc(runs, func(a, b workloadRow) int { return cmp.Compare(a.RequestsPerSec, b.RequestsPerSec) })
		m := runs[1]
		row := shardRow{Shards: k, Procs: wf.procs, Misses: m.Forwards, MissesPerSec: m.RequestsPerSec, P50ms: m.P50ms,
			Leaders: m.Leaders, Errors: m.Errors, StreamCeiling: ceiling}
		for _, r := range runs {
			row.RunsPerSec = append(row.RunsPerSec, r.RequestsPerSec)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func printShards(w io.Writer, rows []shardRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "shards\tprocesses\tmisses\tmisses/s (median of 3)\truns\tp50 ms\tshard leaders\terrors\tone R3 stream msgs/s\twrites/s vs stream")
	for _, r := range rows {
		// A miss is two writes (the reservation and the commit) to its shard.
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.0f\t%.0f\t%.2f\t%s\t%d\t%.0f\t%.2fx\n", r.Shards, r.Procs, r.Misses, r.MissesPerSec, r.RunsPerSec,
			r.P50ms, strings.Join(r.Leaders, ","), r.Errors, r.StreamCeiling, 2*r.MissesPerSec/r.StreamCeiling)
	}
	tw.Flush()
}

// scaleResult is the scale suite's figures.
type scaleResult struct {
	Processes []scaleRow   `json:"processes"`
	Shards    []shardRow   `json:"shards"`
	Records   []recordsRow `json:"records"`
}

func benchScale(ctx context.Context, sf scaleFlags, quick bool, log io.Writer) (scaleResult, error) {
	var res scaleResult
	counts, records, shards, sf, err := sf.counts(quick)
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
		for _, d := range w.Details {
			m, _ := d.(map[string]any)
			count := func(k string) uint64 { v, _ := m[k].(float64); return uint64(v) }
			row.LocalHits += count("LocalHits")
			row.RemoteHits += count("RemoteHits")
			row.Waits += count("Waits")
			row.Touches += count("Touches")
		}
		if w.Forwards > 0 {
			perForward := float64(w.Requests) / float64(w.Forwards)
			row.MsgsPerForward = w.MsgsPerRequest * perForward
			row.DeliveredPerForward = w.DeliveredPerRequest * perForward
		}
		res.Processes = append(res.Processes, row)
	}
	if res.Shards, err = benchShards(ctx, self, shards, sf.shardRequests, log); err != nil {
		return res, err
	}
	res.Records, err = benchRecords(ctx, records, log)
	return res, err
}

func printScale(w io.Writer, rows []scaleRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "processes\trequests\tforwards\tNATS msgs/request\tmsgs/forward\tdelivered/request\tdelivered/forward\tlocal hits\tremote hits\twaits\ttouches\trequests/s\terrors")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%d\t%d\t%d\t%.0f\t%d\n", r.Procs, r.Requests, r.Forwards, r.MsgsPerRequest, r.MsgsPerForward,
			r.DeliveredPerRequest, r.DeliveredPerForward, r.LocalHits, r.RemoteHits, r.Waits, r.Touches, r.RequestsPerSec, r.Errors)
	}
	tw.Flush()
}

// createShards creates the lease bucket on cl with k shards (R3) and
// spreads their leaders over the servers, once they are elected.
func createShards(ctx context.Context, cl *embedded.Cluster, k int) error {
	nc, err := cl.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var b *lease.Bucket
	for {
		// Each attempt bounded: a stream create the meta leader never
		// answers (one elected meanwhile) would otherwise take the minute.
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		b, err = lease.OpenBucket(actx, nc, lease.BucketConfig{Name: lease.DefaultBucket, Replicas: 3, MarkerTTL: time.Minute, Shards: k})
		acancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond) // a new cluster's meta leader is being elected
	}
	for slices.Contains(b.Leaders(ctx), "") {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(50 * time.Millisecond) // the shards' groups are electing
	}
	if _, err := b.SpreadLeaders(ctx); err != nil {
		return err
	}
	return nil
}

// shardLeaders names the server that leads each shard of the lease bucket
// on cl, in shard order ("" where it cannot be read).
func shardLeaders(ctx context.Context, cl *embedded.Cluster) []string {
	nc, err := cl.Connect()
	if err != nil {
		return nil
	}
	defer nc.Close()
	b, err := lease.BindBucket(ctx, nc, lease.BucketConfig{Name: lease.DefaultBucket})
	if err != nil {
		return nil
	}
	return b.Leaders(ctx)
}
