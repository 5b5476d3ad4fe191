package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tmuxSession is embcache top in a detached tmux session, on a tmux
// server of the test's own (-L), so that no other tmux is touched.
type tmuxSession struct {
	t      *testing.T
	tmux   string
	socket string
	exit   string // where the shell writes top's exit status
}

func (s *tmuxSession) run(args ...string) string {
	s.t.Helper()
	out, err := exec.Command(s.tmux, append([]string{"-L", s.socket}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// screen is what the terminal shows now.
func (s *tmuxSession) screen() string { return s.run("capture-pane", "-p", "-t", "top") }

// waitScreen polls the screen until cond holds, for at most d.
func (s *tmuxSession) waitScreen(what string, d time.Duration, cond func(screen string) bool) string {
	s.t.Helper()
	var screen string
	for deadline := time.Now().Add(d); ; {
		screen = s.screen()
		if cond(screen) {
			return screen
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: not on the screen within %v:\n%s", what, d, screen)
		}
		time.Sleep(100 * time.Millisecond) // polling another process's terminal
	}
}

var (
	totalLine = regexp.MustCompile(`total +requests (\d+) +forwards (\d+) +saved (\d+)`)
	nowLine   = regexp.MustCompile(`now +req/s ([\d.]+) +hit (\S+) +forwards/s ([\d.]+) +saved/s ([\d.]+)`)
)

// figures reads the totals line: requests, forwards, saved.
func figures(screen string) (requests, forwards, saved uint64, ok bool) {
	m := totalLine.FindStringSubmatch(screen)
	if m == nil {
		return 0, 0, 0, false
	}
	n := func(s string) uint64 { v, _ := strconv.ParseUint(s, 10, 64); return v }
	return n(m[1]), n(m[2]), n(m[3]), true
}

// TestTopInTmux runs embcache top in a real terminal (tmux) while a load
// runs: the screen shows the load moving, the lease the test holds (its
// holder and renewals), the reconciler, a row per process; once the load
// is done its totals are the processes' own counters summed; s and r
// re-sort, q quits.
func TestTopInTmux(t *testing.T) {
	tmux := requireTool(t, "tmux")
	start := time.Now()
	c := startLiveCluster(t)
	key, release := c.holdLease(t)
	cost := summaryCost(t, c.url)
	load := c.loadgen(t, 3000, 300)
	s := &tmuxSession{t: t, tmux: tmux, socket: fmt.Sprintf("embcache-top-test-%d", os.Getpid()),
		exit: filepath.Join(t.TempDir(), "exit")}
	s.run("new-session", "-d", "-s", "top", "-x", "180", "-y", "50",
		fmt.Sprintf("%s top --nats %s; echo $? > %s", binary, c.url, s.exit))
	t.Cleanup(func() { exec.Command(tmux, "-L", s.socket, "kill-server").Run() })

	screen := s.waitScreen("the load moving, the held lease with a renewal, the reconciler, the processes", 20*time.Second, func(screen string) bool {
		m := nowLine.FindStringSubmatch(screen)
		moving := m != nil && m[1] != "0.0"
		held := false
		for _, line := range strings.Split(screen, "\n") {
			f := strings.Fields(line)
			if len(f) == 4 && f[0] == key && f[1] == "n1" && f[3] != "0" {
				held = true
			}
		}
		return moving && held && strings.Contains(screen, "RECONCILER  n1  lag") &&
			strings.Count(screen, " worker ") == 3 && strings.Contains(screen, " serve ")
	})
	t.Logf("during the load:\n%s", screen)
	// Within one interval: what the processes counted at a moment is on
	// the screen one summary interval and one refresh later (a second of
	// slack for a loaded machine), and the screen never shows more than
	// they have counted.
	asked := time.Now()
	before, _, _ := c.processTotals(t)
	screen = s.waitScreen(fmt.Sprintf("at least the %d requests the processes had counted", before), 20*time.Second, func(screen string) bool {
		r, _, _, ok := figures(screen)
		return ok && r >= before
	})
	lag := time.Since(asked)
	shown, _, _, _ := figures(screen)
	after, _, _ := c.processTotals(t)
	if shown > after || lag > liveInterval+topRefresh+time.Second {
		t.Errorf("the screen showed %d requests %v after the processes had counted %d (and %d after): want within one interval and a refresh",
			shown, lag.Round(time.Millisecond), before, after)
	}
	t.Logf("under load: the processes counted %d, then %d; the screen showed %d, %v after", before, after, shown, lag.Round(time.Millisecond))
	release()
	if err := <-load; err != nil {
		t.Fatal(err)
	}
	t.Logf("summary cost during the load: %s", cost())
	requests, forwards, saved := c.processTotals(t)
	screen = s.waitScreen(fmt.Sprintf("the processes' totals (requests %d, forwards %d, saved %d)", requests, forwards, saved),
		4*liveInterval+2*topRefresh, func(screen string) bool {
			r, f, sv, ok := figures(screen)
			return ok && r == requests && f == forwards && sv == saved
		})
	if !strings.Contains(screen, "LEASES COMPUTING NOW  0") {
		t.Errorf("a lease still computing after the load and the held one ended:\n%s", screen)
	}
	t.Logf("after the load:\n%s", screen)

	s.run("send-keys", "-t", "top", "s")
	s.waitScreen("sorted by HIT%", 5*time.Second, func(screen string) bool { return strings.Contains(screen, "sort: HIT% desc") })
	s.run("send-keys", "-t", "top", "r")
	s.waitScreen("sorted ascending", 5*time.Second, func(screen string) bool { return strings.Contains(screen, "sort: HIT% asc") })
	s.run("send-keys", "-t", "top", "q")
	for deadline := time.Now().Add(10 * time.Second); ; {
		if b, err := os.ReadFile(s.exit); err == nil && strings.TrimSpace(string(b)) != "" {
			if code := strings.TrimSpace(string(b)); code != "0" {
				t.Fatalf("top exited %s", code)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("top did not quit on q:\n%s", s.screen())
		}
		time.Sleep(50 * time.Millisecond) // polling another process's exit
	}
	t.Logf("wall time %v", time.Since(start).Round(time.Millisecond))
}
