package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats.go"
)

// The checker of the fault harness: what a schedule's histories and its
// store must show (faults_test.go lists (a) to (e)).

// invalidation is one the harness issued, from just before its call to
// Invalidate until the call returned; a failed one (ok false) may or may
// not have written its tombstone: it explains a recompute, and promises
// nothing.
type invalidation struct {
	labels   labels
	from, to int64 // unix nanos
	ok       bool
}

// reaches reports whether inv may have tombstoned a record its request
// began at from reserved.
func (inv invalidation) reaches(k int, from int64) bool {
	return inv.labels == faultLabels(k) && inv.to > from
}

// outdates reports whether inv returned having declared stale the value
// a compute that began at t made for key k: the compute's reservation
// came before inv's tombstone.
func (inv invalidation) outdates(k int, t int64) bool {
	return inv.ok && inv.labels == faultLabels(k) && t < inv.from
}

// histories are what a schedule's workers said, and what hit them.
type histories struct {
	all        []hist // every worker's lines, in time order
	windows    []window
	invs       []invalidation
	tenantMode bool
	computes   map[uint64]hist // compute-start lines by compute id
}

func newHistories(all []hist, windows []window, invs []invalidation, tenantMode bool) *histories {
	h := &histories{all: all, windows: windows, invs: invs, tenantMode: tenantMode, computes: map[uint64]hist{}}
	for _, l := range all {
		if l.Ev == "compute-start" {
			h.computes[l.ID] = l
		}
	}
	return h
}

// check checks (a), (b), (d) and (e) on the histories; it returns the
// schedule's stats and the accepted commits by key, for (c).
func (h *histories) check() (faultStats, map[int][]hist, []string) {
	var st faultStats
	var vs []string
	commits := map[int][]hist{}
	computes := map[int]int{}
	for _, l := range h.all {
		switch l.Ev {
		case "committed":
			commits[l.Key] = append(commits[l.Key], l)
		case "compute-start":
			computes[l.Key]++
		case "served":
			st.served++
			c, ok := h.computes[l.ID]
			if !l.OK || !ok || c.Key != l.Key {
				vs = append(vs, fmt.Sprintf("worker %s served key %d with the wrong bytes (compute %x)", l.W, l.Key, l.ID)) // (b)
				continue
			}
			v, old := h.stale(l, c)
			vs = append(vs, v...)
			if old {
				st.outdatedServed++
			}
		case "error":
			if l.Key >= 0 {
				st.errors++
			}
		case "refused":
			st.refused++
		}
	}
	for _, k := range sortedKeys(commits) {
		cs := commits[k]
		for i := 1; i < len(cs); i++ {
			if !h.invalidatedBetween(k, cs[i-1], cs[i]) && !h.replacedBetween(k, cs[i-1], cs[i]) {
				vs = append(vs, fmt.Sprintf("key %d has %d accepted commits, no invalidation between the %d-th and the next; %s",
					k, len(cs), i, h.keyHistory(k))) // (a)
				break
			}
		}
	}
	touched := faultsTouching(h.all, h.windows)
	lost, refusedUnfaulted := h.lostComputes()
	st.refusedUnfaulted = refusedUnfaulted
	for _, k := range sortedKeys(computes) {
		invs := h.invalidationsOf(k)
		if n := computes[k]; n > 1+max(touched[k], lost[k])+invs {
			vs = append(vs, fmt.Sprintf("key %d computed %d times with %d faults touching it, %d invalidations of its labels "+
				"and %d computes refused or kept from committing by a fault; %s", k, n, touched[k], invs, lost[k], h.keyHistory(k))) // (d)
		}
	}
	st.keys = len(computes)
	for _, inv := range h.invs {
		if inv.ok {
			st.invalidations++
		} else {
			st.invalidationsFailed++
		}
	}
	st.heardLags = h.heardLags()
	return st, commits, vs
}

// heardLags are, for each invalidation that returned and each worker
// that heard it, the time from Invalidate's return to the worker's
// applying the event (negative: before the return): tenant mode's window
// (docs/protocol.md 4.4).
func (h *histories) heardLags() []time.Duration {
	var lags []time.Duration
	workers := map[string]bool{}
	for _, l := range h.all {
		workers[l.W] = true
	}
	for _, inv := range h.invs {
		if !inv.ok {
			continue
		}
		for w := range workers {
			if t, ok := h.heard(w, inv); ok {
				lags = append(lags, time.Duration(t-inv.to))
			}
		}
	}
	return lags
}

// stale checks (e) for served line s, whose value compute c made: for
// each invalidation that returned having declared c's value stale (c's
// reservation came before its tombstone), s is a violation if its
// request began after the worker heard the invalidated event (no copy and
// no flight of its labels serves it then), or, outside tenant mode, if it
// came from the store (every path but a local hit: the worker makes one
// request at a time, so no request shares another's flight) and began
// after Invalidate returned. In tenant mode a store read may miss the
// tombstone until the event is heard (docs/protocol.md 4.4). It reports
// whether an invalidation that outdated c's value had begun before s's
// request: a value served within the invalidation's reach.
func (h *histories) stale(s, c hist) (vs []string, outdated bool) {
	for _, inv := range h.invs {
		if !inv.outdates(s.Key, c.T) {
			continue
		}
		if s.From > inv.from {
			outdated = true // served while the invalidation was on its way
		}
		why := ""
		if heard, ok := h.heard(s.W, inv); ok && s.From > heard {
			why = "after the worker heard its event"
		} else if !h.tenantMode && s.Note != coordinator.PathLocalHit.String() && s.From > inv.to {
			why = "from the store after Invalidate returned"
		}
		if why != "" {
			vs = append(vs, fmt.Sprintf("worker %s served key %d (%s) from compute %x, begun before an invalidation of %s, in a request begun %s; %s",
				s.W, s.Key, s.Note, s.ID, inv.labels, why, h.keyHistory(s.Key)))
		}
	}
	return vs, outdated
}

// heard is when worker w applied inv's event: its first heard line of
// inv's labels whose event time is inv's (Invalidate stamps the event
// between from and to, and the harness issues one at a time).
func (h *histories) heard(w string, inv invalidation) (int64, bool) {
	for _, l := range h.all {
		if l.W == w && l.Ev == "heard" && l.Note == inv.labels.String() && l.At >= inv.from && l.At <= inv.to {
			return l.T, true
		}
	}
	return 0, false
}

// invalidatedBetween reports whether an invalidation (a failed one
// included) explains key k's commit c2 after c1: it may have tombstoned
// c1's reservation, and began before c2 was committed.
func (h *histories) invalidatedBetween(k int, c1, c2 hist) bool {
	return slices.ContainsFunc(h.invs, func(inv invalidation) bool { return inv.reaches(k, c1.From) && inv.from < c2.T })
}

// replacedBetween reports whether a Put of other bytes of key k (a
// worker's, stopped past its lease's deadline in the middle of it) landed
// after the Put of c1's value and before c2 was committed (c2's own Put
// aside): it replaced
// c1's payload, whose readers then find it corrupt, purge the record and
// compute the key again (docs/protocol.md 2.4).
func (h *histories) replacedBetween(k int, c1, c2 hist) bool {
	var put1 int64 = -1
	for _, l := range h.all {
		if l.Ev == "put" && l.Key == k && l.W == c1.W && l.ID == c1.ID && l.T <= c1.T {
			put1 = l.T
		}
	}
	return put1 >= 0 && slices.ContainsFunc(h.all, func(l hist) bool {
		return l.Ev == "put" && l.Key == k && l.ID != c1.ID && l.ID != c2.ID && l.T > put1 && l.T < c2.T
	})
}

// lostComputes counts, per key, the computes that did not commit for a
// reason the checker accepts: the lease protocol refused their commit
// (an acknowledgement past the deadline, or of unknown outcome at it:
// docs/protocol.md 3.1), a fault touched them, their worker heard an
// invalidation of their labels during the request, or the request began
// before its worker's event link was up (in both, a pull it then refuses
// is computed unshared: docs/protocol.md 4.4). Each explains the next
// compute of its key, however long the fault (a node stopped for seconds
// can refuse several commits in turn). A refusal needs no fault injected
// here: on a starved machine (three schedules of 3 shards on 2 cores) a
// write can take longer than the harness's 1 s lease less its allowance,
// and the protocol then gives the key up rather than trust the write.
// The run's summary counts such refusals (refusedUnfaulted). A key's
// extra computes are the larger of its faults and its lost computes, not
// their sum, which would count a fault twice.
func (h *histories) lostComputes() (lost map[int]int, refusedUnfaulted int) {
	committed, refused, unlinked := map[[2]any]bool{}, map[[2]any]bool{}, map[[2]any]bool{}
	for _, l := range h.all {
		switch l.Ev {
		case "committed":
			committed[[2]any{l.W, l.From}] = true
		case "refused":
			refused[[2]any{l.W, l.From}] = true
		case "unlinked":
			unlinked[[2]any{l.W, l.From}] = true
		}
	}
	lost = map[int]int{}
	for _, c := range h.all {
		if c.Ev != "compute-start" || committed[[2]any{c.W, c.From}] {
			continue
		}
		end := int64(1 << 62)
		for _, e := range h.all {
			if e.W == c.W && e.From == c.From && e.T >= c.T && (e.Ev == "served" || e.Ev == "error") {
				end = e.T
				break
			}
		}
		faulted := slices.ContainsFunc(h.windows, func(f window) bool { return f.from <= end && f.to >= c.T })
		req := [2]any{c.W, c.From}
		if faulted || refused[req] || unlinked[req] || h.heardDuring(c.W, faultLabels(c.Key), c.From, end) {
			lost[c.Key]++
		}
		if !faulted && refused[req] {
			refusedUnfaulted++
		}
	}
	return lost, refusedUnfaulted
}

// heardDuring reports whether worker w applied an invalidated event of
// labels l between from and to.
func (h *histories) heardDuring(w string, l labels, from, to int64) bool {
	return slices.ContainsFunc(h.all, func(e hist) bool {
		return e.W == w && e.Ev == "heard" && e.Note == l.String() && e.T >= from && e.T <= to
	})
}

// invalidationsOf is the number of invalidations of key k's labels.
func (h *histories) invalidationsOf(k int) int {
	n := 0
	for _, inv := range h.invs {
		if inv.labels == faultLabels(k) {
			n++
		}
	}
	return n
}

// keyHistory is what the workers said of key k and when the faults and
// invalidations were, in ms from the first line of any worker: what a
// violation needs to be understood without a replay (a schedule's timing
// does not replay).
func (h *histories) keyHistory(k int) string {
	if len(h.all) == 0 {
		return ""
	}
	t0 := h.all[0].T
	for _, l := range h.all {
		t0 = min(t0, l.T)
	}
	ms := func(t int64) int64 { return (t - t0) / int64(time.Millisecond) }
	var b strings.Builder
	fmt.Fprintf(&b, "history (labels %s):", faultLabels(k))
	for _, l := range h.all {
		switch {
		case l.Key == k:
			fmt.Fprintf(&b, " [%d ms %s %s rev %d id %x from %d ms %s]", ms(l.T), l.W, l.Ev, l.Rev, l.ID, ms(l.From), l.Note)
		case l.Ev == "heard" && l.Note == faultLabels(k).String():
			fmt.Fprintf(&b, " [%d ms %s heard event of %d ms]", ms(l.T), l.W, ms(l.At))
		}
	}
	for _, w := range h.windows {
		fmt.Fprintf(&b, " [fault %d..%d ms]", ms(w.from), ms(w.to))
	}
	for _, inv := range h.invs {
		if inv.labels == faultLabels(k) {
			fmt.Fprintf(&b, " [invalidation %d..%d ms ok %v]", ms(inv.from), ms(inv.to), inv.ok)
		}
	}
	return b.String()
}

// faultsTouching counts, per key, the faults that hit a compute of it: a
// fault that overlaps the compute, or that begins before its commit could
// land (a compute left open: its worker died).
func faultsTouching(all []hist, windows []window) map[int]int {
	hitKey := map[int]map[int]bool{}
	for _, h := range all {
		if h.Ev != "compute-start" {
			continue
		}
		end := int64(1 << 62)
		for _, e := range all {
			if e.W == h.W && e.Key == h.Key && e.Ev == "compute-end" && e.T >= h.T {
				end = e.T + int64(3*time.Second)
				break
			}
		}
		for fi, f := range windows {
			if f.from <= end && f.to >= h.T {
				if hitKey[h.Key] == nil {
					hitKey[h.Key] = map[int]bool{}
				}
				hitKey[h.Key][fi] = true
			}
		}
	}
	touched := map[int]int{}
	for k, fs := range hitKey {
		touched[k] = len(fs)
	}
	return touched
}

func sortedKeys[V any](m map[int]V) []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// checkStore checks (c): every key's last accepted commit is still its
// record, unless an invalidation may have reached it; then the checker
// may compute the key, but is not served a value an invalidation
// outdated. Not reaching the cluster at all is setup trouble.
func (s *schedule) checkStore(ctx context.Context, h *histories, commits map[int][]hist) ([]string, error) {
	check, closeCheck, err := s.checker(ctx)
	if err != nil {
		return nil, err
	}
	defer closeCheck()
	var vs []string
	for _, k := range sortedKeys(commits) {
		last := commits[k][len(commits[k])-1]
		reached := slices.ContainsFunc(h.invs, func(inv invalidation) bool { return inv.reaches(k, last.From) })
		// A Put of other bytes that landed after the last commit's own
		// replaced its payload: its readers purge the record as corrupt.
		replaced := h.replacedBetween(k, last, hist{T: 1 << 62})
		v, path, err := readBack(ctx, check, k, last.Rev, reached || replaced)
		switch {
		case err != nil:
			vs = append(vs, fmt.Sprintf("key %d: read back: %v; %s", k, err, h.keyHistory(k)))
		case sum(v) != sum(faultValue(k, computeID(v))):
			vs = append(vs, fmt.Sprintf("key %d: read back the wrong bytes (%v)", k, path))
		case replaced: // recomputed, or served the replacing Put's value: either is right
		case !reached && (path != coordinator.PathRemoteHit || computeID(v) != last.ID):
			vs = append(vs, fmt.Sprintf("key %d: committed value (compute %x) not served from the store: %v, compute %x; %s",
				k, last.ID, path, computeID(v), h.keyHistory(k)))
		case reached:
			c, ok := h.computes[computeID(v)]
			if ok && slices.ContainsFunc(h.invs, func(inv invalidation) bool { return inv.outdates(k, c.T) }) {
				vs = append(vs, fmt.Sprintf("key %d: read back compute %x, which an invalidation outdated; %s", k, c.ID, h.keyHistory(k)))
			}
		}
		check.Release("check")
	}
	return vs, nil
}

// checker is the checker's Cache on the cluster, once it has a meta leader
// and the bucket's own leader is elected.
func (s *schedule) checker(ctx context.Context) (*coordinator.Cache, func(), error) {
	nc, err := s.cl.Connect(nats.RetryOnFailedConnect(true))
	if err != nil {
		return nil, nil, setupErrorf("checker: %w", err)
	}
	if err := s.cl.WaitJetStream(ctx); err != nil {
		nc.Close()
		return nil, nil, setupErrorf("checker: %w", err)
	}
	store, err := shm.Open(s.shmDir, shm.WithNode("itest-node"))
	if err != nil {
		nc.Close()
		return nil, nil, setupErrorf("checker: %w", err)
	}
	plane, err := payload.NewRouter("itest-node", payload.TransportShm, store)
	if err != nil {
		nc.Close()
		return nil, nil, setupErrorf("checker: %w", err)
	}
	nctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var check *coordinator.Cache
	err = retry(nctx, func() (err error) {
		check, err = coordinator.New(nctx, nc, coordinator.WithMode(coordinator.ModeStrict), coordinator.WithReplicas(3),
			coordinator.WithPayload(plane), coordinator.WithNode("itest-node"))
		return err
	})
	if err != nil {
		nc.Close()
		return nil, nil, setupErrorf("checker: %w", err)
	}
	return check, func() { check.Close(); nc.Close() }, nil
}

// checkerID is the compute id of the checker's own computes.
const checkerID = 0xc0ffee

// readBack gets key k through check. Unless mayCompute (an invalidation
// may have removed its commit, rev), check must not compute it: the
// commit is in the store. Other errors are retried while the cluster may
// still be electing (readBackTimeout at most).
func readBack(ctx context.Context, check *coordinator.Cache, k int, rev uint64, mayCompute bool) (*payload.Value, coordinator.Path, error) {
	ctx, cancel := context.WithTimeout(ctx, readBackTimeout)
	defer cancel()
	var v *payload.Value
	var path coordinator.Path
	var err error
	retry(ctx, func() error {
		v, path, err = check.GetOrComputePath(ctx, "check", faultRef(k), func(context.Context) (*payload.Value, error) {
			if mayCompute {
				return faultValue(k, checkerID), nil
			}
			return nil, fmt.Errorf("key %d recomputed: its commit (rev %d) was lost", k, rev)
		})
		if err != nil && !strings.Contains(err.Error(), "recomputed") {
			return err // the cluster may still be electing
		}
		return nil
	})
	return v, path, err
}

// The checker flags what docs/protocol.md 4.4 forbids, and only that, on
// made-up histories (times in unix nanos; key 0's labels are itest/m0).
func TestCheckerFindsStaleServes(t *testing.T) {
	l := faultLabels(0)
	inv := invalidation{labels: l, from: 20, to: 30, ok: true}
	compute := hist{T: 10, W: "w0", Ev: "compute-start", Key: 0, ID: 7, From: 5}
	heard := hist{T: 40, W: "w1", Ev: "heard", Key: -1, Note: l.String(), At: 25}
	served := func(from int64, path string) hist {
		return hist{T: from + 1, W: "w1", Ev: "served", Key: 0, OK: true, Note: path, ID: 7, From: from}
	}
	for _, tc := range []struct {
		name       string
		served     hist
		tenantMode bool
		violation  bool
	}{
		{"a store read before Invalidate returned", served(25, "remote-hit"), false, false},
		{"a store read after Invalidate returned", served(35, "remote-hit"), false, true},
		{"tenant mode: a store read before the event was heard", served(35, "remote-hit"), true, false},
		{"tenant mode: a store read after the event was heard", served(45, "remote-hit"), true, true},
		{"a local hit before the event was heard", served(35, "local-hit"), false, false},
		{"a local hit after the event was heard", served(45, "local-hit"), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHistories([]hist{compute, heard, tc.served}, nil, []invalidation{inv}, tc.tenantMode)
			_, _, vs := h.check()
			if got := len(vs) > 0; got != tc.violation {
				t.Fatalf("violation %v, want %v: %q", got, tc.violation, vs)
			}
		})
	}
}

// Two accepted commits of a key are a violation unless an invalidation
// of its labels may have removed the first.
func TestCheckerFindsASecondCommit(t *testing.T) {
	l := faultLabels(0)
	lines := []hist{
		{T: 10, W: "w0", Ev: "compute-start", Key: 0, ID: 7, From: 5},
		{T: 12, W: "w0", Ev: "committed", Key: 0, ID: 7, From: 5, Rev: 2},
		{T: 50, W: "w1", Ev: "compute-start", Key: 0, ID: 9, From: 45},
		{T: 52, W: "w1", Ev: "committed", Key: 0, ID: 9, From: 45, Rev: 5},
	}
	for _, tc := range []struct {
		name      string
		invs      []invalidation
		violation bool
	}{
		{"no invalidation", nil, true},
		{"an invalidation of other labels", []invalidation{{labels: faultLabels(1), from: 20, to: 30, ok: true}}, true},
		{"an invalidation between them", []invalidation{{labels: l, from: 20, to: 30, ok: true}}, false},
		{"a failed invalidation between them", []invalidation{{labels: l, from: 20, to: 30}}, false},
		{"an invalidation after both", []invalidation{{labels: l, from: 60, to: 70, ok: true}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, vs := newHistories(lines, nil, tc.invs, false).check()
			if got := len(vs) > 0; got != tc.violation {
				t.Fatalf("violation %v, want %v: %q", got, tc.violation, vs)
			}
		})
	}
}

// A key computed again is a violation unless something explains it:
// here two computes that did not commit, then a third that did. A commit
// the lease protocol refused explains the next compute; one that failed
// otherwise (here the commit's error) needs a fault over it.
func TestCheckerExplainsComputesThatDidNotCommit(t *testing.T) {
	const s = int64(time.Second) // a fault's reach outlasts a compute by 3 s (faultsTouching)
	lines := func(outcome string) []hist {
		return []hist{
			{T: 10 * s, W: "w0", Ev: "compute-start", Key: 0, ID: 1, From: 5 * s},
			{T: 11 * s, W: "w0", Ev: "compute-end", Key: 0, From: 5 * s},
			{T: 12 * s, W: "w0", Ev: outcome, Key: 0, From: 5 * s},
			{T: 13 * s, W: "w0", Ev: "served", Key: 0, OK: true, ID: 1, From: 5 * s, Note: "computed"},
			{T: 30 * s, W: "w1", Ev: "compute-start", Key: 0, ID: 2, From: 25 * s},
			{T: 31 * s, W: "w1", Ev: "compute-end", Key: 0, From: 25 * s},
			{T: 32 * s, W: "w1", Ev: outcome, Key: 0, From: 25 * s},
			{T: 33 * s, W: "w1", Ev: "served", Key: 0, OK: true, ID: 2, From: 25 * s, Note: "computed"},
			{T: 50 * s, W: "w2", Ev: "compute-start", Key: 0, ID: 3, From: 45 * s},
			{T: 51 * s, W: "w2", Ev: "compute-end", Key: 0, From: 45 * s},
			{T: 52 * s, W: "w2", Ev: "committed", Key: 0, ID: 3, From: 45 * s},
			{T: 53 * s, W: "w2", Ev: "served", Key: 0, OK: true, ID: 3, From: 45 * s, Note: "computed"},
		}
	}
	for _, tc := range []struct {
		name      string
		outcome   string // of the first two computes' commits
		windows   []window
		violation bool
	}{
		{"two refused commits", "refused", nil, false},
		{"two failed commits, no fault", "commit-failed", nil, true},
		{"two failed commits, one fault over both", "commit-failed", []window{{from: 11 * s, to: 35 * s}}, false},
		{"two failed commits, a fault over the first alone", "commit-failed", []window{{from: 11 * s, to: 20 * s}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, vs := newHistories(lines(tc.outcome), tc.windows, nil, false).check()
			if got := len(vs) > 0; got != tc.violation {
				t.Fatalf("violation %v, want %v: %q", got, tc.violation, vs)
			}
		})
	}
}

// A pull refused because an invalidation of its labels was heard during
// the request is computed unshared: that compute is explained by the
// invalidation heard, not by the invalidation's budget alone.
func TestCheckerExplainsAComputeAfterAnInvalidationHeardMidRequest(t *testing.T) {
	const s = int64(time.Second)
	l := faultLabels(0)
	lines := []hist{
		{T: 10 * s, W: "w0", Ev: "compute-start", Key: 0, ID: 1, From: 5 * s},
		{T: 12 * s, W: "w0", Ev: "committed", Key: 0, ID: 1, From: 5 * s},
		{T: 30 * s, W: "w1", Ev: "compute-start", Key: 0, ID: 2, From: 25 * s},
		{T: 32 * s, W: "w1", Ev: "committed", Key: 0, ID: 2, From: 25 * s},
		{T: 33 * s, W: "w2", Ev: "compute-start", Key: 0, ID: 3, From: 26 * s},
		{T: 34 * s, W: "w2", Ev: "served", Key: 0, OK: true, ID: 3, From: 26 * s, Note: "degraded"},
	}
	inv := invalidation{labels: l, from: 20 * s, to: 29 * s, ok: true}
	for _, tc := range []struct {
		name      string
		heard     int64 // when w2 heard the event (0: never)
		violation bool
	}{
		{"heard during w2's request", 31 * s, false},
		{"not heard", 0, true},
		{"heard after w2's request", 40 * s, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all := slices.Clone(lines)
			if tc.heard != 0 {
				all = append(all, hist{T: tc.heard, W: "w2", Ev: "heard", Key: -1, Note: l.String(), At: 25 * s})
			}
			slices.SortStableFunc(all, func(a, b hist) int { return int(a.T - b.T) })
			_, _, vs := newHistories(all, nil, []invalidation{inv}, false).check()
			if got := len(vs) > 0; got != tc.violation {
				t.Fatalf("violation %v, want %v: %q", got, tc.violation, vs)
			}
		})
	}
}

// A request that began before its worker's event link was up and computed
// unshared (the link came up meanwhile) explains a compute of its own; one
// begun with the link up does not.
func TestCheckerExplainsAComputeOfARequestBegunUnlinked(t *testing.T) {
	const s = int64(time.Second)
	lines := []hist{
		{T: 10 * s, W: "w0", Ev: "compute-start", Key: 0, ID: 1, From: 5 * s},
		{T: 12 * s, W: "w0", Ev: "committed", Key: 0, ID: 1, From: 5 * s},
		{T: 33 * s, W: "w2", Ev: "compute-start", Key: 0, ID: 3, From: 26 * s},
		{T: 34 * s, W: "w2", Ev: "served", Key: 0, OK: true, ID: 3, From: 26 * s, Note: "degraded"},
	}
	for _, unlinked := range []bool{true, false} {
		all := slices.Clone(lines)
		if unlinked {
			all = append(all, hist{T: 26 * s, W: "w2", Ev: "unlinked", Key: 0, OK: true, From: 26 * s})
		}
		slices.SortStableFunc(all, func(a, b hist) int { return int(a.T - b.T) })
		_, _, vs := newHistories(all, nil, nil, false).check()
		if got := len(vs) > 0; got == unlinked {
			t.Fatalf("unlinked %v: violations %q", unlinked, vs)
		}
	}
}

// A second commit of a key is explained by a Put of other bytes (a
// worker stopped past its lease in the middle of it) that landed after
// the first commit's Put: it replaced that payload. One that landed
// before does not explain it.
func TestCheckerExplainsASecondCommitAfterALatePut(t *testing.T) {
	const s = int64(time.Second)
	for _, late := range []bool{true, false} {
		zombie := int64(1 * s) // before w1's put
		if late {
			zombie = 3 * s
		}
		all := []hist{
			{T: 1 * s / 2, W: "w0", Ev: "compute-start", Key: 0, ID: 1, From: 0},
			{T: zombie, W: "w0", Ev: "put", Key: 0, OK: true, ID: 1, From: 0},
			{T: zombie + s/100, W: "w0", Ev: "refused", Key: 0, From: 0},
			{T: 15 * s / 10, W: "w1", Ev: "compute-start", Key: 0, ID: 2, From: s},
			{T: 2 * s, W: "w1", Ev: "put", Key: 0, OK: true, ID: 2, From: s},
			{T: 21 * s / 10, W: "w1", Ev: "committed", Key: 0, ID: 2, From: s},
			{T: 5 * s, W: "w2", Ev: "compute-start", Key: 0, ID: 3, From: 4 * s},
			{T: 6 * s, W: "w2", Ev: "put", Key: 0, OK: true, ID: 3, From: 4 * s},
			{T: 7 * s, W: "w2", Ev: "committed", Key: 0, ID: 3, From: 4 * s},
		}
		slices.SortStableFunc(all, func(a, b hist) int { return int(a.T - b.T) })
		windows := []window{{0, 10 * s}, {4 * s, 10 * s}} // w0 stopped, a node stopped: the computes are explained
		_, _, vs := newHistories(all, windows, nil, false).check()
		if got := len(vs) > 0; got == late {
			t.Fatalf("late put %v: violations %q", late, vs)
		}
	}
}
