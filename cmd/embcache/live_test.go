package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/cmd/embcache/internal/demo"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/internal/syncbuf"
	"github.com/embcache/embcache/live"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
)

// liveInterval is the summaries' interval in the live view's tests: the
// figures shown must agree with the processes' own within one.
const liveInterval = 500 * time.Millisecond

// liveCluster is serve (with its page on the metrics port), an encoder
// worker on node enc whose values the prefill workers on p1 and p2 pull
// over HTTP, and the test's own Cache on serve's node n1.
type liveCluster struct {
	url      string // NATS
	page     string // serve's http://host:port
	encoder  string
	prefills []string
	cache    *coordinator.Cache
}

func startLiveCluster(t *testing.T) *liveCluster {
	t.Helper()
	every := "--summary-interval=" + liveInterval.String()
	url, cache, serveOut := startServe(t, "--metrics-listen", "127.0.0.1:0", every)
	c := &liveCluster{url: url, cache: cache,
		page: "http://" + waitOutput(t, serveOut, "embcache serve: metrics at http://", "/metrics")}
	dir := t.TempDir()
	worker := func(node, role string, extra ...string) string {
		out := startProcess(t, append([]string{"worker", "--nats", url, "--node", node, "--role", role,
			"--shm-dir", filepath.Join(dir, node), "--listen", "127.0.0.1:0", "--embed-mb", "0.25", "--encode-ms", "20",
			"--lease-ttl", "1s", every}, extra...)...)
		return "http://" + waitOutput(t, out, "listening on ", "")
	}
	c.encoder = worker("enc", "encoder", "--payload-listen", "127.0.0.1:0")
	c.prefills = []string{worker("p1", "prefill"), worker("p2", "prefill")}
	return c
}

// loadgen runs the workload through the workers; its result comes on
// the channel when it is done.
func (c *liveCluster) loadgen(t *testing.T, requests, unique int) <-chan error {
	t.Helper()
	cmd := exec.Command(binary, "loadgen", "--encoder", c.encoder, "--prefill", strings.Join(c.prefills, ","),
		"--requests", fmt.Sprint(requests), "--unique", fmt.Sprint(unique), "--concurrency", "4", "--seed", "36")
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done, exited := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(exited)
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("loadgen: %w\n%s", err, out.String())
		}
		done <- err
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	return done
}

// processTotals sums the processes' own counters (the workers' /v1/stats
// and the test's Cache.Stats; serve answers no requests): every request
// answered, the encoder forwards, and those answered without one.
func (c *liveCluster) processTotals(t *testing.T) (requests, forwards, saved uint64) {
	t.Helper()
	all := []coordinator.Stats{c.cache.Stats()}
	for _, w := range append([]string{c.encoder}, c.prefills...) {
		s, err := demo.FetchStats(context.Background(), scraper, w)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, s.Cache)
	}
	for _, s := range all {
		for path, n := range s.Requests {
			requests += n
			if path != "computed" && path != "degraded" {
				saved += n
			}
		}
		forwards += s.Computes + s.ComputeErrors
	}
	return requests, forwards, saved
}

// holdLease starts a compute in the test's Cache that lasts until the
// returned function is called: a lease computing, held by node n1.
func (c *liveCluster) holdLease(t *testing.T) (key string, release func()) {
	t.Helper()
	ref := coordinator.Ref{Tenant: "acme", Key: cachekey.Key{0x36, 0x36}, Model: "m", Epoch: 1}
	unblock, done := make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := c.cache.GetOrCompute(context.Background(), "held", ref, func(context.Context) (*payload.Value, error) {
			<-unblock
			return payload.NewTensor(cachekey.Float32, []int64{4}, make([]byte, 16)), nil
		})
		done <- err
	}()
	var once bool
	release = func() {
		if !once {
			once = true
			close(unblock)
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(release)
	return ref.KVKey(), release
}

// requireTool finds a program the test needs: missing, the test skips,
// unless EMBCACHE_REQUIRE_UI=1 (CI, where make test installs it).
func requireTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("EMBCACHE_REQUIRE_UI") == "1" {
		t.Fatalf("EMBCACHE_REQUIRE_UI=1 but %s is not installed: %v (make test-debs installs it)", name, err)
	}
	t.Skipf("%s is not installed (make test-debs installs it; EMBCACHE_REQUIRE_UI=1 makes this a failure)", name)
	return ""
}

// summaryCost measures what the summaries cost on the wire from now
// until the returned function is called: messages per process per
// second, and bytes per message (payload, and the PUB line's subject,
// length and CRLFs: what a publisher sends) as mean and max.
func summaryCost(t *testing.T, url string) func() string {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	msgs, bytes, maxBytes := map[string]int{}, 0, 0
	sub, err := nc.Subscribe(live.TenantSubjects(""), func(m *nats.Msg) {
		n := len("PUB  \r\n\r\n") + len(m.Subject) + len(fmt.Sprint(len(m.Data))) + len(m.Data)
		mu.Lock()
		defer mu.Unlock()
		msgs[m.Subject]++
		bytes += n
		maxBytes = max(maxBytes, n)
	})
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	start := time.Now()
	t.Cleanup(nc.Close)
	return func() string {
		sub.Unsubscribe()
		mu.Lock()
		defer mu.Unlock()
		secs, total := time.Since(start).Seconds(), 0
		for _, n := range msgs {
			total += n
		}
		if total == 0 {
			return "no summaries heard"
		}
		return fmt.Sprintf("%d processes, %d summaries in %.1fs at a %v interval: %.2f msgs/s per process, %d bytes per summary on the wire (max %d), %.0f bytes/s per process",
			len(msgs), total, secs, liveInterval, float64(total)/float64(len(msgs))/secs, bytes/total, maxBytes,
			float64(bytes)/float64(len(msgs))/secs)
	}
}
