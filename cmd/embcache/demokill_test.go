//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/embcache/embcache/internal/syncbuf"
	"golang.org/x/sys/unix"
)

// demoArgs is a demo small enough to run three at once on 2 cores.
var demoArgs = []string{"--requests", "8", "--unique", "4", "--replicas", "1", "--embed-mb", "0.25", "--encode-ms", "1"}

// heldDemo is a demo --hold started by a test, its directories in
// shmRoot and tmp (TMPDIR).
type heldDemo struct {
	cmd    *exec.Cmd
	out    *syncbuf.Buffer
	exited chan error
}

// startHeldDemo starts demo --hold and waits until it holds the cluster
// (its workers and directories are up).
func startHeldDemo(t *testing.T, shmRoot, tmp string) *heldDemo {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"demo", "--hold", "--shm-root", shmRoot}, demoArgs...)...)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.Stdout = nil // the report; progress lines go to stderr
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &heldDemo{cmd: cmd, out: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	holding, read := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			d.out.Write(append(sc.Bytes(), '\n'))
			if strings.Contains(sc.Text(), "embcache demo: holding the cluster") {
				close(holding)
			}
		}
	}()
	go func() {
		<-read // Wait closes the pipe: read it all first
		d.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-d.exited
	})
	select {
	case <-holding:
	case err := <-d.exited:
		d.exited <- err // for the cleanup
		t.Fatalf("demo --hold exited before holding the cluster (%v):\n%s", err, d.out.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("demo --hold not holding the cluster in 2 minutes:\n%s", d.out.String())
	}
	return d
}

// demoDirs returns the demo directories in roots.
func demoDirs(t *testing.T, roots ...string) []string {
	t.Helper()
	var dirs []string
	for _, root := range roots {
		m, err := filepath.Glob(filepath.Join(root, "embcache-demo-run-*"))
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, m...)
	}
	slices.Sort(dirs)
	return dirs
}

// childrenOf returns the processes whose parent is pid.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // ended meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		_, rest, ok := strings.Cut(string(b[strings.LastIndexByte(string(b), ')')+1:]), " ")
		f := strings.Fields(rest)
		if !ok || len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			kids = append(kids, child)
		}
	}
	return kids
}

// awaitEnd waits until the process of pidfd has ended (its pidfd is
// readable), for at most limit.
func awaitEnd(pidfd int, limit time.Duration) error {
	for deadline := time.Now().Add(limit); ; {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("still running after %v", limit)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
		switch {
		case errors.Is(err, unix.EINTR): // the Go runtime's own signals
		case err != nil:
			return err
		case n == 1:
			return nil
		}
	}
}

// killedBy returns the signal that killed a child, as waitid reports its
// end, or -1 if it exited. (On its own, a worker ends on the end of its
// stdin, or killed by SIGPIPE as it writes an answer to its killed demo.)
func killedBy(info *unix.Siginfo) syscall.Signal {
	const cldKilled = 2 // si_code: killed by a signal
	if info.Code != cldKilled {
		return -1
	}
	// si_status, after si_pid and si_uid in the union that follows
	// si_signo, si_errno, si_code and their padding (16 bytes).
	return syscall.Signal(*(*int32)(unsafe.Add(unsafe.Pointer(info), 16+4+4)))
}

// TestAKilledDemoLeavesNothingBehind: a demo killed with SIGKILL takes
// its workers with it (killed, or exited as their stdin closed; not left
// running on their own), and its
// directories, left behind in /dev/shm and the temporary directory, are
// removed by the next demo; the directories of a demo still running are
// left alone, and it goes on to end cleanly.
func TestAKilledDemoLeavesNothingBehind(t *testing.T) {
	shmRoot, tmp := t.TempDir(), t.TempDir()
	live := startHeldDemo(t, shmRoot, tmp)
	liveDirs := demoDirs(t, shmRoot, tmp)
	if len(liveDirs) != 2 {
		t.Fatalf("a running demo has directories %v, want one in each of %s and %s", liveDirs, shmRoot, tmp)
	}

	// The workers of the demo to be killed are orphans once it is: this
	// process adopts them (a subreaper), to see how they end.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	doomed := startHeldDemo(t, shmRoot, tmp)
	doomedDirs := slices.DeleteFunc(demoDirs(t, shmRoot, tmp), func(d string) bool { return slices.Contains(liveDirs, d) })
	workers := childrenOf(t, doomed.cmd.Process.Pid)
	if len(doomedDirs) != 2 || len(workers) != 2 {
		t.Fatalf("the second demo: directories %v, workers %v; want 2 of each", doomedDirs, workers)
	}
	pidfds := make([]int, len(workers))
	for i, pid := range workers {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		pidfds[i] = fd
	}

	doomed.cmd.Process.Signal(syscall.SIGKILL)
	<-doomed.exited
	doomed.exited <- nil // for the cleanup
	for i, fd := range pidfds {
		// Readable once the worker has ended; then it is this process's
		// to reap.
		if err := awaitEnd(fd, time.Minute); err != nil {
			t.Fatalf("worker %d: %v after its demo was killed", workers[i], err)
		}
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED, nil); err != nil {
			t.Fatalf("reaping worker %d: %v", workers[i], err)
		}
		// Killed with its demo (Pdeathsig), or ended on its own as the
		// demo's death closed its stdin: the kernel closes a dying
		// process's files before it signals its children, and a worker
		// that reads its stdin then may exit first. Killed by another
		// signal (SIGPIPE, writing to the dead demo), it outlived it.
		const cldExited = 1 // si_code: exited
		if sig := killedBy(&info); sig != syscall.SIGKILL && info.Code != cldExited {
			t.Errorf("worker %d ended by signal %d (si_code %d), not killed (SIGKILL) with its demo nor exited", workers[i], sig, info.Code)
		}
	}
	for _, d := range doomedDirs {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("the killed demo's %s: %v (it is the next demo's to remove)", d, err)
		}
	}

	next := exec.Command(binary, append([]string{"demo", "--shm-root", shmRoot}, demoArgs...)...)
	next.Env = append(os.Environ(), "TMPDIR="+tmp)
	out, err := next.CombinedOutput()
	if err != nil {
		t.Fatalf("the next demo: %v\n%s", err, out)
	}
	for _, d := range doomedDirs {
		if !strings.Contains(string(out), "embcache demo: removed "+d+", left by a demo that was killed") {
			t.Errorf("the next demo does not say it removed %s:\n%s", d, out)
		}
	}
	if got := demoDirs(t, shmRoot, tmp); !slices.Equal(got, liveDirs) {
		t.Fatalf("after the next demo: directories %v, want the running demo's %v", got, liveDirs)
	}
	if entries, err := os.ReadDir(liveDirs[0]); err != nil || len(entries) == 0 {
		t.Fatalf("the running demo's %s: %d entries, %v", liveDirs[0], len(entries), err)
	}

	live.cmd.Process.Signal(os.Interrupt)
	if err := <-live.exited; err != nil {
		t.Fatalf("the running demo on Ctrl-C: %v\n%s", err, live.out.String())
	}
	live.exited <- nil
	if got := demoDirs(t, shmRoot, tmp); len(got) != 0 {
		t.Fatalf("a demo that ended left %v", got)
	}
}
