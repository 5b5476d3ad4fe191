package main

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/embcache/embcache/live"
)

// topColumn is a column of top's process table, and how it sorts.
type topColumn struct {
	name  string
	width int
	cell  func(p *live.Process) string
	less  func(a, b *live.Process) int // ascending
}

// hitRatio is p's over its last interval, or -1 without requests.
func hitRatio(r live.Rates) float64 {
	if r.HitRatio == nil {
		return -1
	}
	return *r.HitRatio
}

var topColumns = []topColumn{
	{"NODE", 16, func(p *live.Process) string { return p.Node }, func(a, b *live.Process) int { return cmp.Compare(a.Node, b.Node) }},
	{"ROLE", 14, roleCell, func(a, b *live.Process) int { return cmp.Compare(roleCell(a), roleCell(b)) }},
	{"PID", 8, func(p *live.Process) string { return fmt.Sprint(p.PID) }, func(a, b *live.Process) int { return cmp.Compare(a.PID, b.PID) }},
	{"REQ/S", 8, func(p *live.Process) string { return fmt.Sprintf("%.1f", p.Rates.Total) },
		func(a, b *live.Process) int { return cmp.Compare(a.Rates.Total, b.Rates.Total) }},
	{"HIT%", 6, func(p *live.Process) string { return percent(p.Rates.HitRatio) },
		func(a, b *live.Process) int { return cmp.Compare(hitRatio(a.Rates), hitRatio(b.Rates)) }},
	{"FWD/S", 7, func(p *live.Process) string { return fmt.Sprintf("%.1f", p.Rates.Forwards) },
		func(a, b *live.Process) int { return cmp.Compare(a.Rates.Forwards, b.Rates.Forwards) }},
	{"REQUESTS", 9, func(p *live.Process) string { return fmt.Sprint(p.Counters.Total) },
		func(a, b *live.Process) int { return cmp.Compare(a.Counters.Total, b.Counters.Total) }},
	{"FORWARDS", 9, func(p *live.Process) string { return fmt.Sprint(p.Counters.Forwards) },
		func(a, b *live.Process) int { return cmp.Compare(a.Counters.Forwards, b.Counters.Forwards) }},
	{"HELD", 9, func(p *live.Process) string { return bytesText(float64(p.Held)) },
		func(a, b *live.Process) int { return cmp.Compare(a.Held, b.Held) }},
	{"PINNED", 9, func(p *live.Process) string { return bytesText(float64(p.Pinned)) },
		func(a, b *live.Process) int { return cmp.Compare(a.Pinned, b.Pinned) }},
	{"STATE", 0, processState, func(a, b *live.Process) int { return cmp.Compare(processState(a), processState(b)) }},
}

// roleCell is p's role, and the tenant it serves if it serves only one
// (worker/acme): the single-account layout's workers of one node differ
// by it.
func roleCell(p *live.Process) string {
	if p.Tenant == "" {
		return p.Role
	}
	return p.Role + "/" + p.Tenant
}

// processState says what is wrong with p, if anything.
func processState(p *live.Process) string {
	var s []string
	if p.StoreDown {
		s = append(s, "store-down")
	}
	if p.Rates.Degraded > 0 {
		s = append(s, "degrading")
	}
	if p.Counters.Lost > 0 {
		s = append(s, fmt.Sprintf("lost:%d", p.Counters.Lost))
	}
	if p.Reconciler != nil && p.Reconciler.Active {
		s = append(s, "reconciler")
	}
	if len(s) == 0 {
		return "ok"
	}
	return strings.Join(s, ",")
}

// topModel is what top shows, apart from how it is drawn: a View, the
// sort the operator chose, and the lines they make.
type topModel struct {
	view    live.View
	sortBy  int  // index in topColumns
	reverse bool // descending
	source  string
}

func newTopModel(source string) *topModel {
	return &topModel{sortBy: 3, reverse: true, source: source} // busiest first
}

// key applies a key press; it reports whether top should quit.
func (m *topModel) key(r rune) (quit bool) {
	switch r {
	case 'q', 'Q':
		return true
	case 's':
		m.sortBy = (m.sortBy + 1) % len(topColumns)
	case 'S':
		m.sortBy = (m.sortBy + len(topColumns) - 1) % len(topColumns)
	case 'r', 'R':
		m.reverse = !m.reverse
	}
	return false
}

// sorted returns the view's processes in the chosen order (ties by node
// and id, so that rows do not jump).
func (m *topModel) sorted() []live.Process {
	ps := slices.Clone(m.view.Processes)
	c := topColumns[m.sortBy]
	slices.SortStableFunc(ps, func(a, b live.Process) int {
		d := c.less(&a, &b)
		if m.reverse {
			d = -d
		}
		return cmp.Or(d, cmp.Compare(a.Node, b.Node), cmp.Compare(a.ID, b.ID))
	})
	return ps
}

// topLine is one line of the screen; header lines are drawn bold.
type topLine struct {
	text   string
	header bool
}

// lines lays the view out, at most maxLeases lease rows.
func (m *topModel) lines(maxLeases int) []topLine {
	v, t := &m.view, &m.view.Totals
	var out []topLine
	add := func(header bool, format string, args ...any) {
		out = append(out, topLine{fmt.Sprintf(format, args...), header})
	}
	arrow := "asc"
	if m.reverse {
		arrow = "desc"
	}
	degraded := ""
	if t.Degraded > 0 {
		degraded = fmt.Sprintf(", %d DEGRADED", t.Degraded)
	}
	add(true, "embcache top  %s  %s  %d processes%s  sort: %s %s  (s/S sort, r reverse, q quit)",
		m.source, v.Time.Format("15:04:05"), t.Processes, degraded, topColumns[m.sortBy].name, arrow)
	r := t.Rates
	add(false, "now       req/s %.1f  hit %s  forwards/s %.1f  saved/s %.1f", r.Total, percent(r.HitRatio), r.Forwards, r.Saved)
	add(false, "by path   %s", perPath(r.Requests))
	add(false, "bytes/s   %s", perTransport(r.Pulled, r.Written))
	c := t.Counters
	add(false, "total     requests %d  forwards %d  saved %d  hit %s  degraded %d  lost %d  held %s  pinned %s",
		c.Total, c.Forwards, c.Saved, percent(t.HitRatio), c.Degraded, c.Lost, bytesText(float64(t.Held)), bytesText(float64(t.Pinned)))
	out = append(out, topLine{})
	if rec := v.Reconciler; rec != nil {
		node := rec.Node
		if node == "" {
			node = "none active"
		}
		lag := "unknown"
		if rec.LagKnown {
			lag = fmt.Sprintf("%d events, %.1fs", rec.LagEvents, rec.LagSec)
		}
		if rec.Err != "" {
			lag += " (" + rec.Err + ")"
		}
		add(true, "RECONCILER  %s  lag %s", node, lag)
		out = append(out, topLine{})
	}
	add(true, "LEASES COMPUTING NOW  %d", len(v.Leases))
	if len(v.Leases) > 0 {
		add(true, "  %-72s %-16s %8s %9s", "KEY", "HOLDER", "AGE", "RENEWALS")
		for i, l := range v.Leases {
			if i == maxLeases {
				add(false, "  ... %d more", len(v.Leases)-maxLeases)
				break
			}
			add(false, "  %-72s %-16s %7.1fs %9d", l.Key, l.Holder, l.AgeSec, l.Renewals)
		}
	}
	out = append(out, topLine{})
	var head strings.Builder
	head.WriteString("  ")
	for i, col := range topColumns {
		name := col.name
		if i == m.sortBy {
			name += map[bool]string{true: "v", false: "^"}[m.reverse]
		}
		fmt.Fprintf(&head, "%-*s ", col.width, name)
	}
	add(true, "PROCESSES")
	out = append(out, topLine{strings.TrimRight(head.String(), " "), true})
	for _, p := range m.sorted() {
		var row strings.Builder
		row.WriteString("  ")
		for _, col := range topColumns {
			fmt.Fprintf(&row, "%-*s ", col.width, clip(col.cell(&p), col.width))
		}
		out = append(out, topLine{strings.TrimRight(row.String(), " "), false})
	}
	if len(v.Dropped) > 0 {
		out = append(out, topLine{})
		add(false, "summaries dropped: %v", v.Dropped)
	}
	return out
}

// clip cuts s to width (0: any width).
func clip(s string, width int) string {
	if width > 0 && len(s) > width {
		return s[:width-1] + "~"
	}
	return s
}

func percent(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100**r)
}

// perPath lists the rates by path, in the paths' order.
func perPath(rates map[string]float64) string {
	var parts []string
	for _, p := range []string{"local-hit", "coalesced", "remote-hit", "waited", "computed", "degraded"} {
		parts = append(parts, fmt.Sprintf("%s %.1f", p, rates[p]))
	}
	return strings.Join(parts, "  ")
}

// perTransport lists bytes read (pulled) and written by transport.
func perTransport(pulled, written map[string]float64) string {
	names := slices.Sorted(maps.Keys(pulled))
	for k := range written {
		if !slices.Contains(names, k) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		return "-"
	}
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s read %s/s written %s/s", n, bytesText(pulled[n]), bytesText(written[n])))
	}
	return strings.Join(parts, "   ")
}

// bytesText is n bytes in binary units.
func bytesText(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// topRefresh is how often top redraws.
const topRefresh = time.Second
