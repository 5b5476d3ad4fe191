package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/cmd/embcache/internal/demo"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/syncbuf"
	"github.com/embcache/embcache/lease"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestEveryProcessCountsJunk is the operator's curl: events and lease
// records that do not decode, one per reason, published while serve (with
// its reconciler), a worker and an agent run; each one's /metrics counts
// every event's reason, and the good event among them as decoded (the
// events are invalidations, which every process follows); serve's, whose
// reconciler watches the bucket, every record's; the worker's and the
// agent's /v1/stats count the events too.
func TestEveryProcessCountsJunk(t *testing.T) {
	url, _, serveOut := startServe(t, "--metrics-listen", "127.0.0.1:0")
	serveMetrics := "http://" + waitOutput(t, serveOut, "embcache serve: metrics at http://", "/metrics") + "/metrics"
	// The reconciler is active, and its first sweep comes once its
	// consumer and bucket watcher run.
	waitScrape(t, "serve", serveMetrics, []string{"embcache_reconciler_active", "embcache_reconciler_elections_total",
		`embcache_reconciler_actions_total action="sweep"`})

	dir := t.TempDir()
	workerOut := startProcess(t, "worker", "--nats", url, "--node", "w1", "--shm-dir", filepath.Join(dir, "w"),
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	workerMetrics := "http://" + waitOutput(t, workerOut, "embcache worker: metrics at http://", "/metrics") + "/metrics"
	workerAddr := waitOutput(t, workerOut, "listening on ", "")
	socket := filepath.Join(dir, "agent.sock")
	agentOut := startProcess(t, "agent", "--nats", url, "--node", "a1", "--shm-dir", filepath.Join(dir, "a"),
		"--socket", socket, "--metrics-listen", "127.0.0.1:0")
	agentMetrics := "http://" + waitOutput(t, agentOut, "embcache agent: metrics at http://", "/metrics") + "/metrics"
	waitOutput(t, agentOut, "listening on ", "") // joined: its watcher and event consumer run

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	key := func(i byte) cachekey.Key { return cachekey.Key{0xd0, i} }
	junkEvents := map[string][]byte{
		"too_large": make([]byte, events.MaxEventSize+1),
		"malformed": []byte("not an event"),
		"version":   {0x81, 0xa1, 'v', 99},   // {"v": 99}
		"invalid":   {0x81, 0xa1, 'v', 0x01}, // {"v": 1} and nothing else
	}
	i := byte(0)
	for _, body := range junkEvents {
		i++ // the stream keeps one event per subject
		// Invalidations: what every worker follows.
		if _, err := js.Publish(ctx, "embcache.ev.acme.invalidated."+key(i).String(), body); err != nil {
			t.Fatal(err)
		}
	}
	goodEvent := &events.Event{Kind: events.KindInvalidated, Tenant: "acme", Key: events.InvalidationKey("other", 1),
		Model: "other", Epoch: 1, Time: time.Now()}
	good, err := events.Encode(goodEvent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, goodEvent.Subject(), good); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, lease.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	junkRecords := map[string]string{
		"malformed": "not a record",
		"version":   `{"v":9}`,
		"invalid":   `{"v":1,"state":"computing"}`, // no owner
	}
	for _, body := range junkRecords {
		i++
		if _, err := kv.Put(ctx, "acme."+key(i).String(), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}

	want := []string{`embcache_events_decoded_total kind="invalidated"`}
	for r := range junkEvents {
		want = append(want, `embcache_events_bad_total reason="`+r+`"`)
	}
	waitScrape(t, "worker", workerMetrics, want)
	waitScrape(t, "agent", agentMetrics, want)
	// serve's reconciler watches the bucket; a worker hears only of the
	// keys it waits on.
	for r := range junkRecords {
		want = append(want, `embcache_records_bad_total op="watch" reason="`+r+`"`)
	}
	waitScrape(t, "serve", serveMetrics, want)

	ws, err := demo.FetchStats(ctx, scraper, "http://"+workerAddr)
	if err != nil {
		t.Fatal(err)
	}
	if ws.Cache.EventsBad < 4 || ws.Cache.EventsDecoded < 1 {
		t.Errorf("worker /v1/stats: %+v", ws.Cache)
	}
	ac := agent.Dial(socket)
	defer ac.Close()
	as, err := ac.Stats(ctx)
	if err != nil || as.Cache.EventsBad < 4 || as.Cache.EventsDecoded < 1 {
		t.Errorf("agent /v1/stats: %v %+v", err, as.Cache)
	}
}

// startProcess runs the binary with args until the test ends (SIGINT,
// then wait) and returns its combined output.
func startProcess(t *testing.T, args ...string) *syncbuf.Buffer {
	t.Helper()
	cmd := exec.Command(binary, args...)
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	return out
}

// waitOutput waits for a line of out holding prefix and returns what
// follows it, up to suffix ("" for the rest of the line).
func waitOutput(t *testing.T, out *syncbuf.Buffer, prefix, suffix string) string {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		sc := bufio.NewScanner(strings.NewReader(out.String()))
		for sc.Scan() {
			_, rest, ok := strings.Cut(sc.Text(), prefix)
			if !ok {
				continue
			}
			if suffix != "" {
				rest, _, _ = strings.Cut(rest, suffix)
			}
			return strings.TrimSpace(rest)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in 20s:\n%s", prefix, out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling another process's output
	}
}

// scraper makes no idle connections, which would outlive the test.
var scraper = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}

// waitScrape scrapes url until each of want, a metric name and labels
// ("name k=\"v\" ..."), has a series of at least 1.
func waitScrape(t *testing.T, who, url string, want []string) {
	t.Helper()
	var body string
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := scraper.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
		}
		var missing []string
		for _, w := range want {
			if sample(body, w) < 1 {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s /metrics after 20s: %q below 1 in\n%s", who, missing, body)
		}
		time.Sleep(50 * time.Millisecond) // polling another process's counters
	}
}

// sample returns the sum of the series of a Prometheus text exposition
// that have the metric name and labels of want ("name k=\"v\" ..."), or -1
// if there is none.
func sample(body, want string) float64 {
	fields := strings.Fields(want)
	total, found := 0.0, false
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		sp := strings.LastIndexByte(line, ' ')
		if strings.HasPrefix(line, "#") || sp < 0 {
			continue
		}
		series, value := line[:sp], line[sp+1:]
		name, labels, _ := strings.Cut(strings.TrimSuffix(series, "}"), "{")
		if name != fields[0] {
			continue
		}
		match := true
		for _, l := range fields[1:] {
			match = match && slices.Contains(strings.Split(labels, ","), l)
		}
		if v, err := strconv.ParseFloat(value, 64); match && err == nil {
			total, found = total+v, true
		}
	}
	if !found {
		return -1
	}
	return total
}

// startAgentWithoutNATS starts an agent whose NATS is not there, waiting
// --wait-store for it, with its output in out.
func startAgentWithoutNATS(t *testing.T, waitStore string) (*exec.Cmd, *syncbuf.Buffer) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(binary, "agent", "--nats", "nats://127.0.0.1:1", "--wait-store", waitStore, "--node", "a1",
		"--shm-dir", filepath.Join(dir, "shm"), "--socket", filepath.Join(dir, "agent.sock"))
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// An agent stopped while it waits for a store that is not there exits
// at once and quietly: it does not log that it serves without the store,
// nor listen first (a new user's walkthrough found both).
func TestAnAgentStoppedWhileItWaitsForTheStoreExits(t *testing.T) {
	cmd, out := startAgentWithoutNATS(t, "1m")
	waitOutput(t, out, "store unreachable", "") // logged as the node starts, before the agent waits for the store
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, out.String())
	}
	if s := out.String(); strings.Contains(s, "serving without the store") || strings.Contains(s, "listening on") {
		t.Fatalf("stopped while waiting for the store, it went on:\n%s", s)
	}
}

// TestAgentWaitStoreCountsFromItsStart: --wait-store began after the
// node's first try at the store (an op timeout, 2 s), so an agent waited
// that much longer than asked. With a wait shorter than that try, it
// serves without the store as soon as the try fails.
func TestAgentWaitStoreCountsFromItsStart(t *testing.T) {
	cmd, out := startAgentWithoutNATS(t, "1s")
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	waitOutput(t, out, "serving without the store", "")
	if !strings.Contains(out.String(), "no NATS server answers") {
		t.Errorf("the store's error does not say that no NATS server answers:\n%s", out.String())
	}
	at := func(msg string) time.Time {
		t.Helper()
		for l := range strings.Lines(out.String()) {
			if !strings.Contains(l, msg) {
				continue
			}
			v, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
			ts, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			return ts
		}
		t.Fatalf("no %q:\n%s", msg, out.String())
		return time.Time{}
	}
	// The try's failure and the end of the wait: the same moment, not a
	// whole --wait-store apart.
	if d := at("serving without the store").Sub(at("store unreachable")); d > 900*time.Millisecond {
		t.Fatalf("served without the store %v after its first try failed, with --wait-store 1s:\n%s", d, out.String())
	}
}
