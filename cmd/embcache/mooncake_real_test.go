//go:build mooncake && cgo

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/mooncaketest"
)

// TestServeAndWorkersThroughRealMooncake: the binary built with the
// mooncake tag, against a real Mooncake Store. serve holds the node's
// segment (the long-lived process); a worker computes a value and writes
// it through Mooncake, a second worker (another process, no segment of its
// own) pulls it back through Mooncake; then SIGTERM ends serve cleanly
// ("stopped", exit 0) although Mooncake's library takes over SIGINT,
// SIGTERM and SIGHUP in the processes that create a store.
// mooncakeNode is serve, built with the mooncake tag, on a real store's
// master, and what its workers need.
type mooncakeNode struct {
	bin, dir, work string
	master         *mooncaketest.Master
	port           int
	serve          *exec.Cmd
	lines          chan string
	seen           []string
}

// startMooncakeNode builds the tagged binary, starts a master and serve
// (contributing segment bytes) and waits until serve is ready.
func startMooncakeNode(t *testing.T, segment string) *mooncakeNode {
	t.Helper()
	c := &mooncakeNode{dir: mooncaketest.Dir(t), work: t.TempDir()}
	c.master = mooncaketest.StartMaster(t, c.dir)
	c.bin = filepath.Join(t.TempDir(), "embcache-mooncake")
	if out, err := exec.Command("go", "build", "-tags", "mooncake", "-o", c.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags mooncake: %v\n%s", err, out)
	}
	c.port, _ = embedded.FreePort("127.0.0.1")
	c.serve = exec.Command(c.bin, append([]string{"serve", "--port", fmt.Sprint(c.port), "--store-dir", filepath.Join(c.work, "js"),
		"--shm-dir", filepath.Join(c.work, "shm")}, c.flags(segment)...)...)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c.serve.Stdout, c.serve.Stderr = w, w
	if err := c.serve.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		if c.serve.ProcessState == nil {
			c.serve.Process.Kill()
			c.serve.Wait()
		}
		r.Close()
	})
	c.lines = make(chan string, 1024)
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	c.wait(t, "embcache serve: ready")
	return c
}

// flags are the mooncake flags of a process of the node.
func (c *mooncakeNode) flags(segment string) []string {
	return []string{"--payload", "mooncake", "--mooncake-master", c.master.Addr, "--mooncake-metadata", c.master.Metadata,
		"--mooncake-lib", mooncaketest.Library(c.dir), "--mooncake-hostname", "127.0.0.1",
		"--mooncake-segment-bytes", segment, "--node", "n1"}
}

// wait reads serve's output until a line holds want.
func (c *mooncakeNode) wait(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("serve exited before %q:\n%s", want, mooncaketest.Tail(strings.Join(c.seen, "\n"), 4000))
			}
			c.seen = append(c.seen, l)
			if strings.Contains(l, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no %q within 60 s:\n%s", want, mooncaketest.Tail(strings.Join(c.seen, "\n"), 4000))
		}
	}
}

// worker runs one short-lived worker (no segment) for input image and
// returns the path of its answer.
func (c *mooncakeNode) worker(t *testing.T, image int) string {
	t.Helper()
	cmd := exec.Command(c.bin, append([]string{"worker", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", c.port),
		"--shm-dir", filepath.Join(c.work, "shm"), "--embed-mb", "1", "--encode-ms", "1"}, c.flags("0")...)...)
	cmd.Stdin = strings.NewReader(fmt.Sprintf(`{"id":1,"image":%d,"cache":true}`+"\n", image))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("worker: %v\n%s", err, mooncaketest.Tail(string(out), 4000))
	}
	_, rest, ok := strings.Cut(string(out), `"path":"`)
	if !ok {
		t.Fatalf("the worker answered no path:\n%s", mooncaketest.Tail(string(out), 4000))
	}
	path, _, _ := strings.Cut(rest, `"`)
	return path
}

// holder starts an agent of the node that holds a segment of the store,
// the node's long-lived process.
func (c *mooncakeNode) holder(t *testing.T, name string) *exec.Cmd {
	t.Helper()
	var log bytes.Buffer
	cmd := exec.Command(c.bin, append([]string{"agent", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", c.port),
		"--socket", filepath.Join(c.work, name, "agent.sock"), "--shm-dir", filepath.Join(c.work, name, "shm")},
		c.flags(fmt.Sprint(64<<20))...)...)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(c.work, name, "agent.sock")); err == nil {
			return cmd
		}
		if time.Now().After(deadline) {
			t.Fatalf("holder %s not up in 30 s:\n%s", name, mooncaketest.Tail(log.String(), 3000))
		}
	}
}

func TestServeAndWorkersThroughRealMooncake(t *testing.T) {
	c := startMooncakeNode(t, fmt.Sprint(64<<20)) // serve holds the segment
	worker := func() string { return c.worker(t, 7) }
	if p := worker(); p != "computed" {
		t.Fatalf("first worker: %s, want computed", p)
	}
	if p := worker(); p != "remote-hit" {
		t.Fatalf("second worker: %s, want remote-hit (pulled through Mooncake)", p)
	}

	c.serve.Process.Signal(syscall.SIGTERM)
	c.wait(t, "embcache serve: stopped")
	for l := range c.lines {
		c.seen = append(c.seen, l)
	}
	if err := c.serve.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v\n%s", err, mooncaketest.Tail(strings.Join(c.seen, "\n"), 4000))
	}
}

// TestMooncakeHolderKilled: serve contributes no memory and an agent of
// the node holds the store's only segment. A value computed and shared
// through it; the holder killed (SIGKILL): its objects go with it, and a
// reader finds the value unreadable and computes it itself (the right
// bytes: nothing is served that is not the value); it cannot be shared
// while no process holds a segment; a new holder, and the value is
// computed once more and shared again.
func TestMooncakeHolderKilled(t *testing.T) {
	c := startMooncakeNode(t, "0")
	first := c.holder(t, "holder1")
	if p := c.worker(t, 9); p != "computed" {
		t.Fatalf("first: %s, want computed", p)
	}
	if p := c.worker(t, 9); p != "remote-hit" {
		t.Fatalf("second: %s, want remote-hit", p)
	}
	first.Process.Kill()
	first.Wait()
	if p := c.worker(t, 9); p != "computed" {
		t.Fatalf("after the holder died: %s, want computed (its object unreadable)", p)
	}
	c.holder(t, "holder2")
	deadline := time.Now().Add(60 * time.Second)
	for {
		p := c.worker(t, 9)
		if p == "remote-hit" {
			break
		}
		if p != "computed" || time.Now().After(deadline) {
			t.Fatalf("with a new holder: %s, want computed until shared again, then remote-hit", p)
		}
	}
}
