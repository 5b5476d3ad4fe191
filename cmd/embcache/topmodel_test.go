package main

import (
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/live"
)

func topTestView() live.View {
	half, most := 0.5, 0.9
	p := func(node, role string, total, forwards float64, held int64) live.Process {
		if total == 0 {
			return live.Process{Node: node, Role: role, ID: node + role, PID: 7}
		}
		return live.Process{Node: node, Role: role, ID: node + role, PID: 7, Held: held,
			Rates:    live.Rates{Total: total, Forwards: forwards, HitRatio: map[bool]*float64{true: &half, false: &most}[forwards > 1]},
			Counters: live.Counters{Total: uint64(total * 10)}}
	}
	ratio := 0.8
	return live.View{Time: time.Date(2026, 12, 5, 13, 0, 0, 0, time.UTC),
		Totals: live.Totals{Processes: 3, Degraded: 1, Counters: live.Counters{Total: 100, Forwards: 20, Saved: 80},
			Rates: live.Rates{Total: 30, Saved: 24, Forwards: 6, HitRatio: &ratio,
				Pulled: map[string]float64{"http": 3 << 20}, Written: map[string]float64{"shm": 1024}}},
		Processes:  []live.Process{p("b", "worker", 10, 5, 2<<20), p("a", "worker", 20, 1, 1<<20), p("c", "serve", 0, 0, 0)},
		Leases:     []live.Lease{{Key: "acme.0011", Holder: "b", AgeSec: 3.25, Renewals: 2}},
		Reconciler: &live.Reconciler{Node: "c", LagKnown: true, LagEvents: 4, LagSec: 1.5},
	}
}

func rowsOf(lines []topLine) []string {
	var rows []string
	in := false
	for _, l := range lines {
		if strings.HasPrefix(l.text, "  NODE") {
			in = true
			continue
		}
		if in && l.text != "" {
			rows = append(rows, strings.Fields(l.text)[0])
		}
	}
	return rows
}

func TestTopSortsAndReverses(t *testing.T) {
	m := newTopModel("nats://x")
	m.view = topTestView()
	if got := strings.Join(rowsOf(m.lines(10)), ","); got != "a,b,c" { // REQ/S, busiest first
		t.Fatalf("by req/s: %s", got)
	}
	m.key('s') // HIT%
	if got := strings.Join(rowsOf(m.lines(10)), ","); got != "a,b,c" {
		t.Fatalf("by hit ratio: %s", got)
	}
	m.key('s') // FWD/S
	if got := strings.Join(rowsOf(m.lines(10)), ","); got != "b,a,c" {
		t.Fatalf("by forwards: %s", got)
	}
	m.key('r')
	if got := strings.Join(rowsOf(m.lines(10)), ","); got != "c,a,b" {
		t.Fatalf("by forwards, ascending: %s", got)
	}
	for range len(topColumns) - 2 {
		m.key('s')
	}
	if m.sortBy != 3 {
		t.Fatalf("s cycles: column %d", m.sortBy)
	}
	m.key('S')
	if m.sortBy != 2 || m.key('x') || !m.key('q') {
		t.Fatal("S goes back; x does nothing; q quits")
	}
}

func TestTopLines(t *testing.T) {
	m := newTopModel("nats://x")
	m.view = topTestView()
	text := ""
	for _, l := range m.lines(10) {
		text += l.text + "\n"
	}
	for _, want := range []string{
		"3 processes, 1 DEGRADED", "now       req/s 30.0  hit 80.0%  forwards/s 6.0  saved/s 24.0",
		"http read 3.0 MiB/s written 0 B/s", "shm read 0 B/s written 1.0 KiB/s",
		"total     requests 100  forwards 20  saved 80", "RECONCILER  c  lag 4 events, 1.5s",
		"LEASES COMPUTING NOW  1", "acme.0011", "3.2s", "REQ/Sv",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in\n%s", want, text)
		}
	}
	m.view.Leases = append(m.view.Leases, m.view.Leases[0], m.view.Leases[0])
	if !strings.Contains(linesText(m.lines(1)), "... 2 more") {
		t.Error("leases past the room left are counted, not drawn")
	}
}

func linesText(ls []topLine) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.text + "\n")
	}
	return b.String()
}

// TestTopRoleNamesTheTenant: a process that serves one tenant shows it
// beside its role, so that two workers of one node tell apart.
func TestTopRoleNamesTheTenant(t *testing.T) {
	m := newTopModel("nats://x")
	m.view = topTestView()
	m.view.Processes[0].Tenant = "acme"
	m.view.Processes[1].Tenant = "beta"
	text := linesText(m.lines(10))
	for _, want := range []string{" worker/acme ", " worker/beta ", " serve "} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in\n%s", want, text)
		}
	}
}
