package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("EMBCACHE_WORKER"); mode != "" {
		os.Exit(runWorker(mode))
	}
	goleak.VerifyTestMain(m)
}

// env is one embedded NATS server, one shm directory and one computes log
// shared by the worker processes of a test.
type env struct {
	t        *testing.T
	url      string
	shmDir   string
	computes string
	leaseTTL time.Duration
}

func newEnv(t *testing.T, leaseTTL time.Duration) *env {
	t.Helper()
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	dir, err := os.MkdirTemp("/dev/shm", "embcache-itest-")
	if err != nil {
		dir = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	return &env{t: t, url: srv.ClientURL(), shmDir: dir, computes: t.TempDir() + "/computes", leaseTTL: leaseTTL}
}

type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan result
	stderr *bytes.Buffer
	exited chan struct{}
}

func (e *env) start(mode string, vars ...string) *proc {
	e.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "EMBCACHE_WORKER="+mode, "EMBCACHE_NATS="+e.url, "EMBCACHE_SHM="+e.shmDir,
		"EMBCACHE_COMPUTES="+e.computes, "EMBCACHE_LEASE_TTL="+e.leaseTTL.String())
	cmd.Env = append(cmd.Env, vars...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	p := &proc{t: e.t, cmd: cmd, stdin: stdin, lines: make(chan result, 1024), stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	var readers sync.WaitGroup
	readers.Go(func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r result
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				r = result{Key: -1, Err: "bad line: " + sc.Text()}
			}
			p.lines <- r
		}
	})
	go func() {
		readers.Wait()
		cmd.Wait()
		close(p.exited)
	}()
	e.t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// next returns the worker's next result line; a worker that exits or
// stays silent for a minute fails the test.
func (p *proc) next() result {
	p.t.Helper()
	select {
	case r, ok := <-p.lines:
		if !ok {
			<-p.exited
			p.t.Fatalf("worker exited: %v\n%s", p.cmd.ProcessState, p.stderr)
		}
		if r.Key == -1 && r.Err != "" {
			p.t.Fatalf("worker failed: %s\n%s", r.Err, p.stderr)
		}
		return r
	case <-time.After(time.Minute):
		p.t.Fatalf("worker silent for a minute\n%s", p.stderr)
	}
	return result{}
}

func (p *proc) send(line string) { io.WriteString(p.stdin, line+"\n") }

func (p *proc) wait() {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		p.t.Fatal("worker did not exit")
	}
	if !p.cmd.ProcessState.Success() {
		p.t.Fatalf("worker: %v\n%s", p.cmd.ProcessState, p.stderr)
	}
}

// computeCounts reads the computes log: how many times each key's fn ran.
func (e *env) computeCounts() map[int]int {
	e.t.Helper()
	raw, err := os.ReadFile(e.computes)
	if err != nil && !os.IsNotExist(err) {
		e.t.Fatal(err)
	}
	counts := map[int]int{}
	for _, line := range strings.Fields(string(raw)) {
		k, err := strconv.Atoi(line)
		if err != nil {
			e.t.Fatalf("bad computes line %q", line)
		}
		counts[k]++
	}
	return counts
}

func env2(k, v string) string { return fmt.Sprintf("%s=%s", k, v) }
