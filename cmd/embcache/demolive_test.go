package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/embcache/embcache/internal/syncbuf"
	"github.com/embcache/embcache/live"
)

// TestDemoPointsAtTheLiveView: demo prints the page and the embcache top
// command; with --hold the cluster stays up, and both show it working
// (top --once --json: every process, requests answered, the reconciler);
// Ctrl-C ends it.
func TestDemoPointsAtTheLiveView(t *testing.T) {
	cmd := exec.Command(binary, "demo", "--hold", "--requests", "40", "--unique", "8", "--replicas", "2",
		"--embed-mb", "0.25", "--encode-ms", "5")
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	page := waitOutput(t, out, "embcache demo: watch it live at ", " or with")
	natsURL := waitOutput(t, out, " top --nats ", "")
	waitOutput(t, out, "embcache demo: holding the cluster", "")
	resp, err := scraper.Get(page)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %s", page, resp.Status)
	}
	top := exec.Command(binary, "top", "--nats", natsURL, "--once", "--json", "--wait", "2500ms")
	top.Stderr = os.Stderr
	b, err := top.Output()
	if err != nil {
		t.Fatal(err)
	}
	var v live.View
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("top --once --json: %v\n%s", err, b)
	}
	// The reconciler's node, the encoder and two prefill workers.
	if v.Totals.Processes != 4 || v.Totals.Counters.Total == 0 || v.Reconciler == nil || v.Reconciler.Node != "demo" {
		t.Fatalf("top sees %+v, reconciler %+v", v.Totals, v.Reconciler)
	}
	cmd.Process.Signal(os.Interrupt)
	if err := <-exited; err != nil {
		t.Fatalf("demo --hold on Ctrl-C: %v\n%s", err, out.String())
	}
	exited <- nil
	if !strings.Contains(out.String(), "encoder forwards") {
		t.Fatalf("no report before the hold:\n%s", out.String())
	}
}
