//go:build mooncake && cgo

package main

import (
	"bufio"
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
func TestServeAndWorkersThroughRealMooncake(t *testing.T) {
	dir := mooncaketest.Dir(t)
	m := mooncaketest.StartMaster(t, dir)
	bin := filepath.Join(t.TempDir(), "embcache-mooncake")
	if out, err := exec.Command("go", "build", "-tags", "mooncake", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags mooncake: %v\n%s", err, out)
	}
	port, _ := embedded.FreePort("127.0.0.1")
	work := t.TempDir()
	mooncake := func(segment string) []string {
		return []string{"--payload", "mooncake", "--mooncake-master", m.Addr, "--mooncake-metadata", m.Metadata,
			"--mooncake-lib", mooncaketest.Library(dir), "--mooncake-hostname", "127.0.0.1",
			"--mooncake-segment-bytes", segment, "--node", "n1"}
	}
	serve := exec.Command(bin, append([]string{"serve", "--port", fmt.Sprint(port), "--store-dir", filepath.Join(work, "js"),
		"--shm-dir", filepath.Join(work, "shm")}, mooncake(fmt.Sprint(64<<20))...)...)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	serve.Stdout, serve.Stderr = w, w
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		if serve.ProcessState == nil {
			serve.Process.Kill()
			serve.Wait()
		}
		r.Close()
	})
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var seen []string
	wait := func(want string) {
		t.Helper()
		timeout := time.After(60 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("serve exited before %q:\n%s", want, mooncaketest.Tail(strings.Join(seen, "\n"), 4000))
				}
				seen = append(seen, l)
				if strings.Contains(l, want) {
					return
				}
			case <-timeout:
				t.Fatalf("no %q within 60 s:\n%s", want, mooncaketest.Tail(strings.Join(seen, "\n"), 4000))
			}
		}
	}
	wait("embcache serve: ready")

	worker := func() string {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"worker", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port),
			"--shm-dir", filepath.Join(work, "shm"), "--embed-mb", "1", "--encode-ms", "1", "--strict"}, mooncake("0")...)...)
		cmd.Stdin = strings.NewReader(`{"id":1,"image":7,"cache":true}` + "\n")
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
	if p := worker(); p != "computed" {
		t.Fatalf("first worker: %s, want computed", p)
	}
	if p := worker(); p != "remote-hit" {
		t.Fatalf("second worker: %s, want remote-hit (pulled through Mooncake)", p)
	}

	serve.Process.Signal(syscall.SIGTERM)
	wait("embcache serve: stopped")
	for l := range lines {
		seen = append(seen, l)
	}
	if err := serve.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v\n%s", err, mooncaketest.Tail(strings.Join(seen, "\n"), 4000))
	}
}
