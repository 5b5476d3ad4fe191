package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/inspect"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/zeebo/blake3"
)

// The records part of the scale suite (issue 17 item 3): with N committed
// records in the bucket (and a published event of each in the stream), how
// long a new process takes from its start to its first hit, what the
// reconciler holds (its heap) and takes on a first start (a sweep) and on
// a failover (from the election key's marker), and how long the operator's
// stats and leases ls take. Every process measured is a fresh one.

// recordsRow is one record count's figures.
type recordsRow struct {
	Records          int     `json:"records"`
	PopulateSeconds  float64 `json:"populate_s"` // writing the records and events (SyncAlways off)
	JoinMs           float64 `json:"join_first_hit_ms"`
	JoinPath         string  `json:"join_path"`
	ColdMs           float64 `json:"reconciler_cold_ms"` // start to active with its sweep done
	ColdHeap         uint64  `json:"reconciler_cold_heap_bytes"`
	FailoverMs       float64 `json:"reconciler_failover_ms"` // the first one killed to the second active (a lease TTL of waiting included)
	FailoverHeap     uint64  `json:"reconciler_failover_heap_bytes"`
	FailoverSweeps   uint64  `json:"reconciler_failover_sweeps"`
	StatsMs          float64 `json:"stats_ms"`
	StatsLiveMs      float64 `json:"stats_live_ms"`
	StatsLiveValues  int     `json:"stats_live_values"` // what stats --live counted (every record is live)
	LeasesLsMs       float64 `json:"leases_ls_ms"`
	HeapPerRecordB   float64 `json:"reconciler_heap_per_record_bytes"` // failover heap / records
	BucketBytes      uint64  `json:"bucket_bytes"`                     // the lease bucket's stored bytes
	EventBytes       uint64  `json:"event_bytes"`                      // the event stream's stored bytes (a published event per record)
	ReconcilerLeaseS float64 `json:"reconciler_lease_ttl_s"`
}

const recordsTenant = "bench"

// recordKey is the key of record i.
func recordKey(i int) cachekey.Key {
	return cachekey.Key(blake3.Sum256([]byte("embcache-bench/record/" + strconv.Itoa(i))))
}

func benchRecords(ctx context.Context, counts []int, log io.Writer) ([]recordsRow, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var rows []recordsRow
	for _, n := range counts {
		fmt.Fprintf(log, "scale: %d records ...\n", n)
		row, err := benchRecordsOne(ctx, self, n)
		if err != nil {
			return rows, fmt.Errorf("%d records: %w", n, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func benchRecordsOne(ctx context.Context, self string, n int) (recordsRow, error) {
	row := recordsRow{Records: n}
	dir, err := os.MkdirTemp("", "embcache-bench-records-")
	if err != nil {
		return row, err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(dir, "js"), NoSync: true})
	if err != nil {
		return row, err
	}
	defer srv.Shutdown()
	shmDir := filepath.Join(dir, "shm")
	start := time.Now()
	if err := populate(ctx, srv.ClientURL(), shmDir, n); err != nil {
		return row, err
	}
	row.PopulateSeconds = time.Since(start).Seconds()

	cfg := recordsConfig{NATS: srv.ClientURL(), ShmDir: shmDir, Key: recordKey(0).String()}
	var join recordsReport
	if join, row.JoinMs, err = runRecordsChild(ctx, self, "join", cfg); err != nil {
		return row, fmt.Errorf("join: %w", err)
	}
	row.JoinPath = join.Path

	// A first reconciler (no election record: it sweeps), which exits
	// without giving its lease back; then a second, which waits the lease
	// out and starts from the first one's last renewal.
	cfg.ExpectSweep = true
	cold, coldMs, err := runRecordsChild(ctx, self, "reconcile", cfg)
	if err != nil {
		return row, fmt.Errorf("reconciler: %w", err)
	}
	row.ColdMs, row.ColdHeap, row.ReconcilerLeaseS = coldMs, cold.Heap, cold.LeaseTTLS
	cfg.ExpectSweep = false
	failover, failMs, err := runRecordsChild(ctx, self, "reconcile", cfg)
	if err != nil {
		return row, fmt.Errorf("failover: %w", err)
	}
	row.FailoverMs, row.FailoverHeap, row.FailoverSweeps = failMs, failover.Heap, failover.Sweeps
	row.HeapPerRecordB = float64(failover.Heap) / float64(n)

	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return row, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	t0 := time.Now()
	if _, err := inspect.Summarize(ctx, js, false); err != nil {
		return row, err
	}
	row.StatsMs = msSince(t0)
	t0 = time.Now()
	sum, err := inspect.Summarize(ctx, js, true)
	if err != nil {
		return row, err
	}
	row.StatsLiveMs = msSince(t0)
	if sum.Bucket != nil {
		row.BucketBytes = sum.Bucket.Bytes
	}
	if sum.Events != nil {
		row.EventBytes = sum.Events.Bytes
	}
	if sum.LiveValues != nil {
		row.StatsLiveValues = *sum.LiveValues
	}
	kv, err := inspect.Bucket(ctx, nc)
	if err != nil {
		return row, err
	}
	t0 = time.Now()
	if _, total, err := inspect.Keys(ctx, kv, "", 1000); err != nil || total < n {
		return row, fmt.Errorf("leases ls: %d keys, %v", total, err)
	}
	row.LeasesLsMs = msSince(t0)
	return row, nil
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// populate writes n committed records (record 0's payload really is in
// the shm store at shmDir; the others name files nobody reads) and a
// published event of each, asynchronously, 4096 in flight.
func populate(ctx context.Context, url, shmDir string, n int) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	var failed atomic.Int64
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
	stall := jetstream.WithStallWait(time.Minute)
	b, err := lease.OpenBucket(ctx, nc, lease.BucketConfig{Name: lease.DefaultBucket, MarkerTTL: time.Minute})
	if err != nil {
		return err
	}
	if _, err := events.EnsureStream(ctx, js, events.StreamConfig{Replicas: 1}); err != nil {
		return err
	}
	store, err := shm.Open(shmDir, shm.WithNode("bench-node"))
	if err != nil {
		return err
	}
	v := payload.NewTensor(cachekey.Float32, []int64{256}, make([]byte, 1024))
	loc0, err := store.Put(ctx, payload.ObjectID{Tenant: recordsTenant, Key: recordKey(0)}, v)
	if err != nil {
		return err
	}
	now := time.Now()
	expires := now.Add(time.Hour)
	for i := range n {
		k := recordKey(i)
		loc := loc0
		if i > 0 {
			loc.Object = payload.ObjectID{Tenant: recordsTenant, Key: k}.String()
			loc.Checksum = payload.Checksum(blake3.Sum256(k[:]))
		}
		rec := lease.Record{V: lease.RecordVersion, State: lease.StateCommitted, Owner: "bench-node/1/populate", Nonce: "p",
			Started: now, Heartbeat: now, Model: "m", Reserved: 1, Location: &loc, Size: loc.Size, Checksum: loc.Checksum.String(),
			Kind: "tensor", DType: "float32", Shape: []int64{256}, Expires: expires}
		data, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		msg := &nats.Msg{Subject: b.Subject(lease.ValueKey(recordsTenant, k)), Data: data, Header: nats.Header{}}
		if _, err := js.PublishMsgAsync(msg, jetstream.WithMsgTTL(time.Hour), stall); err != nil {
			return err
		}
		e := &events.Event{Kind: events.KindPublished, Tenant: recordsTenant, Key: k, Model: "m", Node: "bench-node",
			Time: now, Expires: expires, Location: &loc}
		body, err := events.Encode(e)
		if err != nil {
			return err
		}
		if _, err := js.PublishAsync(e.Subject(), body, stall); err != nil {
			return err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Minute):
		return fmt.Errorf("populate: %d publishes not acknowledged in 10 minutes", js.PublishAsyncPending())
	}
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("populate: %d publishes failed", n)
	}
	return nil
}

// recordsConfig is what a records child needs.
type recordsConfig struct {
	NATS   string `json:"nats"`
	ShmDir string `json:"shm_dir"`
	Key    string `json:"key"` // join: the key of the first hit
	// ExpectSweep: the reconciler reports once its sweep is done (else one
	// second after it is active, its catch-up under way).
	ExpectSweep bool `json:"expect_sweep"`
}

// recordsReport is a records child's one line.
type recordsReport struct {
	Path      string  `json:"path,omitempty"` // join: how the first request was answered
	Heap      uint64  `json:"heap_bytes,omitempty"`
	Sweeps    uint64  `json:"sweeps"`
	LeaseTTLS float64 `json:"lease_ttl_s,omitempty"`
	Err       string  `json:"err,omitempty"`
}

// startRecordsChild starts `embcache-bench records-<role>` and returns its
// report and the wall time from its start to the report; the child exits
// after it (the caller waits for it).
func startRecordsChild(ctx context.Context, self, role string, cfg recordsConfig) (recordsReport, float64, *exec.Cmd, error) {
	conf, _ := json.Marshal(cfg)
	cmd := exec.CommandContext(ctx, self, "records-"+role, "--config", string(conf))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return recordsReport{}, 0, nil, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return recordsReport{}, 0, nil, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	took := msSince(start)
	var rep recordsReport
	if err == nil {
		err = json.Unmarshal([]byte(line), &rep)
	}
	if err == nil && rep.Err != "" {
		err = fmt.Errorf("%s", rep.Err)
	}
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return rep, took, nil, err
	}
	return rep, took, cmd, nil
}

// runRecordsChild is startRecordsChild, then ends the child.
func runRecordsChild(ctx context.Context, self, role string, cfg recordsConfig) (recordsReport, float64, error) {
	rep, took, cmd, err := startRecordsChild(ctx, self, role, cfg)
	if cmd != nil {
		cmd.Wait()
	}
	return rep, took, err
}

// newRecordsChildren are the hidden commands the records part runs as
// fresh processes.
func newRecordsChildren() []*cobra.Command {
	child := func(role, short string, run func(context.Context, recordsConfig) recordsReport) *cobra.Command {
		var config string
		cmd := &cobra.Command{
			Use: "records-" + role, Short: short, Hidden: true, Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				var cfg recordsConfig
				if err := json.Unmarshal([]byte(config), &cfg); err != nil {
					return usagef("bad --config: %v", err)
				}
				return writeJSONLine(cmd.OutOrStdout(), run(cmd.Context(), cfg))
			},
		}
		cmd.Flags().StringVar(&config, "config", "", "the child's JSON config")
		return cmd
	}
	return []*cobra.Command{
		child("join", "Join as a worker and serve one hit (run by embcache-bench)", recordsJoin),
		child("reconcile", "Run a reconciler until it is active (run by embcache-bench)", recordsReconcile),
	}
}

// recordsJoin starts a node as a worker does and asks for record 0.
func recordsJoin(ctx context.Context, cfg recordsConfig) recordsReport {
	key, err := cachekey.Parse(cfg.Key)
	if err != nil {
		return recordsReport{Err: err.Error()}
	}
	n, err := node.New(node.Options{NATSURL: cfg.NATS, Name: "bench-node", ShmDir: cfg.ShmDir, Logger: newLogger(os.Stderr)})
	if err == nil {
		err = n.Start(ctx)
	}
	if err != nil {
		return recordsReport{Err: err.Error()}
	}
	defer n.Close()
	if err := n.Ready(ctx); err != nil {
		return recordsReport{Err: err.Error()}
	}
	_, path, err := n.Cache().GetOrComputePath(ctx, "join", coordinator.Ref{Tenant: recordsTenant, Key: key, Model: "m"},
		func(context.Context) (*payload.Value, error) { return nil, fmt.Errorf("the first request computed") })
	if err != nil {
		return recordsReport{Err: err.Error()}
	}
	return recordsReport{Path: path.String()}
}

// recordsReconcile runs a reconciler until it is active and its sweep is
// done (cfg.ExpectSweep) or a second has passed; then it reports its heap
// (after a collection) and its sweeps, and exits without giving its lease
// back (it expires).
func recordsReconcile(ctx context.Context, cfg recordsConfig) recordsReport {
	nc, err := nats.Connect(cfg.NATS)
	if err != nil {
		return recordsReport{Err: err.Error()}
	}
	const ttl = 5 * time.Second
	r, err := reconciler.New(nc, reconciler.WithNode("bench-node"), reconciler.WithLeaseTTL(ttl), reconciler.WithLogger(newLogger(os.Stderr)))
	if err != nil {
		return recordsReport{Err: err.Error()}
	}
	go r.Run(ctx)
	// A sweep counts as done before its progress mark says so; one that
	// exits in between leaves "sweeping" to its successor, which sweeps
	// again (as it must: TestScaleQuick saw it once in 5 runs).
	swept := func() bool { return r.Stats().Sweeps > 0 && !progressSweeping(ctx, nc) }
	for s := r.Stats(); !s.Active || (cfg.ExpectSweep && !swept()); s = r.Stats() {
		select {
		case <-ctx.Done():
			return recordsReport{Err: ctx.Err().Error()}
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !cfg.ExpectSweep {
		time.Sleep(time.Second) // its catch-up under way
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return recordsReport{Heap: ms.HeapAlloc, Sweeps: r.Stats().Sweeps, LeaseTTLS: ttl.Seconds()}
}

func printRecords(w io.Writer, rows []recordsRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "records\tjoin to first hit ms\treconciler cold ms\tcold heap MB\tfailover ms\tfailover heap MB\theap B/record\tstats ms\tstats --live ms\tleases ls ms\tbucket B/record\tevents B/record")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%.1f (%s)\t%.0f\t%.1f\t%.0f\t%.1f\t%.1f\t%.1f\t%.0f\t%.1f\t%.0f\t%.0f\n", r.Records, r.JoinMs, r.JoinPath, r.ColdMs,
			float64(r.ColdHeap)/(1<<20), r.FailoverMs, float64(r.FailoverHeap)/(1<<20), r.HeapPerRecordB, r.StatsMs, r.StatsLiveMs, r.LeasesLsMs,
			float64(r.BucketBytes)/float64(r.Records), float64(r.EventBytes)/float64(r.Records))
	}
	tw.Flush()
}

// parseCounts reads a comma-separated list of counts >= 1.
func parseCounts(flag, s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		if strings.TrimSpace(p) == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			return nil, usagef("scale: --%s %q: want counts >= 1", flag, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// progressSweeping reports whether the active reconciler's progress mark
// says a sweep is owed (true if it cannot be read).
func progressSweeping(ctx context.Context, nc *nats.Conn) bool {
	js, err := jetstream.New(nc)
	if err != nil {
		return true
	}
	kv, err := js.KeyValue(ctx, lease.DefaultBucket)
	if err != nil {
		return true
	}
	e, err := kv.Get(ctx, reconciler.ProgressKey)
	if err != nil {
		return true
	}
	var p struct {
		Sweeping bool `json:"sweeping"`
	}
	return json.Unmarshal(e.Value(), &p) != nil || p.Sweeping
}
