// Package testproc runs the test binary again as another process of a
// test: a writer, a server or a segment holder that must not share the
// test's address space. The parent starts one of the binary's tests with
// Start; that test is the child, which skips unless its environment says
// it was started so, prints the lines the parent waits for, and runs
// until StdinClosed returns.
package testproc

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/syncbuf"
)

// stopWait is how long a child has to exit once its stdin closes before
// it is killed.
const stopWait = 10 * time.Second

// Proc is a running child process of a test.
type Proc struct {
	stderr *syncbuf.Buffer
	exited chan struct{} // closed once it has exited and err is set
	err    error         // how it exited

	mu      sync.Mutex
	lines   []string      // its stdout so far, a line at a time
	next    int           // the first line Line has not looked at
	eof     bool          // its stdout has ended
	changed chan struct{} // closed when lines or eof change
}

// Start runs the test binary's test named test (an exact name) as a child
// process, with env added to its environment, until tb ends: then its
// stdin closes, which tells it to stop, and it is killed if it has not
// exited within 10 s.
func Start(tb testing.TB, test string, env ...string) *Proc {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proc{stderr: new(syncbuf.Buffer), exited: make(chan struct{}), changed: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		defer close(p.exited)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			p.update(func() { p.lines = append(p.lines, s.Text()) })
		}
		io.Copy(io.Discard, stdout)
		p.update(func() { p.eof = true })
		p.err = cmd.Wait() // after the reads, as Wait requires
	}()
	tb.Cleanup(func() {
		stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(stopWait):
			cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// Line waits up to timeout for the first line of the child's stdout that
// starts with prefix, and returns the rest of it. If the child exits or
// the time runs out first, it fails tb with what the child printed.
func (p *Proc) Line(tb testing.TB, prefix string, timeout time.Duration) string {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		for ; p.next < len(p.lines); p.next++ {
			if rest, ok := strings.CutPrefix(p.lines[p.next], prefix); ok {
				p.next++
				p.mu.Unlock()
				return rest
			}
		}
		eof, changed, out := p.eof, p.changed, strings.Join(p.lines, "\n")
		p.mu.Unlock()
		if eof {
			tb.Fatalf("testproc: the child exited without printing %q:\n%s\n%s", prefix, out, p.stderr.Tail(3000))
		}
		select {
		case <-changed:
		case <-deadline.C:
			tb.Fatalf("testproc: the child printed no %q in %v:\n%s\n%s", prefix, timeout, out, p.stderr.Tail(3000))
		}
	}
}

// Wait waits up to timeout for the child to exit on its own, and fails tb
// if it has not, or if it exited with an error.
func (p *Proc) Wait(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		tb.Fatalf("testproc: the child has not exited in %v:\n%s", timeout, p.stderr.Tail(3000))
	}
	if p.err != nil {
		tb.Fatalf("testproc: the child: %v\n%s", p.err, p.stderr.Tail(3000))
	}
}

// update applies f under p's lock and wakes Line.
func (p *Proc) update(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
	close(p.changed)
	p.changed = make(chan struct{})
}

// StdinClosed returns once the parent has closed the child's stdin: the
// child's cue to stop.
func StdinClosed() { io.Copy(io.Discard, os.Stdin) }
