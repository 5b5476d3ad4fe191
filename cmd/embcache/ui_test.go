package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// chromium drives Debian's chromium headless against serve's page.
type chromium struct {
	t       *testing.T
	bin     string
	profile string
	page    string
}

// run loads the page, lets its script run for 3 s of virtual time (its
// polls included), and does what args ask (--dump-dom, --screenshot).
func (c *chromium) run(args ...string) []byte {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, append([]string{"--headless", "--no-sandbox", "--disable-gpu",
		"--no-first-run", "--user-data-dir=" + c.profile, "--virtual-time-budget=3000"}, append(args, c.page)...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		c.t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

var dataValue = regexp.MustCompile(`id="([a-z-]+)" data-value="([^"]*)"`)

// figures loads the page and returns its figures by element id.
func (c *chromium) figures() (map[string]float64, string) {
	c.t.Helper()
	dom := string(c.run("--dump-dom"))
	f := map[string]float64{}
	for _, m := range dataValue.FindAllStringSubmatch(dom, -1) {
		if v, err := strconv.ParseFloat(m[2], 64); err == nil {
			f[m[1]] = v
		}
	}
	return f, dom
}

// TestPageInChromium loads serve's page in headless Chromium while
// loadgen runs: the figures move from one load to the next and within
// one (it polls), the lease the test holds shows with its holder, a
// screenshot is taken; once the load is done the page's totals are the
// processes' own counters summed (within a few intervals).
func TestPageInChromium(t *testing.T) {
	bin := requireTool(t, "chromium")
	start := time.Now()
	c := startLiveCluster(t)
	// The page as an operator has it open: serve listens from then on.
	if resp, err := scraper.Get(c.page + "/api/live"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	key, release := c.holdLease(t)
	load := c.loadgen(t, 4000, 400)
	ch := &chromium{t: t, bin: bin, profile: t.TempDir(), page: c.page + "/"}

	var first map[string]float64
	for deadline := time.Now().Add(60 * time.Second); ; {
		f, dom := ch.figures()
		// Five processes: serve, the test's Cache, three workers.
		if f["processes"] == 5 && f["rate-requests"] > 0 && f["updates"] >= 2 && f["lease-count"] >= 1 &&
			strings.Contains(dom, key) && strings.Contains(dom, "active on n1") {
			first = f
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never showed the load, the held lease and the reconciler: %v\n%s", f, dom)
		}
	}
	shot := filepath.Join(t.TempDir(), "live.png")
	ch.run("--window-size=1400,1100", "--screenshot="+shot)
	png, err := os.ReadFile(shot)
	if err != nil || len(png) < 10<<10 || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("screenshot: %d bytes, %v", len(png), err)
	}
	if dir := os.Getenv("EMBCACHE_UI_SCREENSHOT_DIR"); dir != "" {
		os.WriteFile(filepath.Join(dir, "live.png"), png, 0o644)
	}
	// The page never shows more than the processes have counted, and
	// shows at least what they had counted before it was loaded (loading
	// takes longer than a summary interval).
	before, _, _ := c.processTotals(t)
	second, _ := ch.figures()
	after, _, _ := c.processTotals(t)
	if got := uint64(second["total-requests"]); got < before || got > after {
		t.Errorf("the page showed %d requests; the processes had counted %d before it loaded, %d after", got, before, after)
	}
	if second["total-requests"] <= first["total-requests"] {
		select {
		case err := <-load:
			t.Fatalf("the load ended (%v) before the figures were seen to move: %v then %v", err, first, second)
		default:
			t.Fatalf("the figures did not move under load: %v then %v", first, second)
		}
	}
	release()
	if err := <-load; err != nil {
		t.Fatal(err)
	}
	requests, forwards, saved := c.processTotals(t)
	want := map[string]float64{"total-requests": float64(requests), "total-forwards": float64(forwards), "total-saved": float64(saved), "lease-count": 0}
	var f map[string]float64
	for deadline := time.Now().Add(60 * time.Second); ; {
		f, _ = ch.figures()
		agree := true
		for id, v := range want {
			agree = agree && f[id] == v
		}
		if agree {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page's figures %v never agreed with the processes' %v", f, want)
		}
	}
	t.Logf("during the load %v; after it %v (the processes: %v); screenshot %d bytes; wall time %v",
		first, f, want, len(png), time.Since(start).Round(time.Millisecond))
}
