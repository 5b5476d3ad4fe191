package live

import (
	"cmp"
	"maps"
	"slices"
	"time"
)

// snapshot is what a View or a Sample is made of, copied under the
// Aggregator's lock and built into one outside it. The copy is a slice
// of pointers: Receive and receiveStored replace a process's proc and a
// key's held record when they change, and never change one stored, so
// what a snapshot points to holds still.
type snapshot struct {
	now      time.Time
	procs    []*proc      // the processes heard
	leases   []keyedLease // the keys computing (for a View)
	election *held        // the reconciler's election record, or nil
	lagSeen  Reconciler
	history  []Point
	dropped  map[string]uint64 // nil if none
}

// keyedLease is a key computing and its record.
type keyedLease struct {
	key string
	l   *held
}

// snapshotLocked forgets the processes silent too long and the leases
// past their TTL, and copies the other processes and, for a View
// (whole), the leases, the reconciler's, the history and the drops. The
// processes are forgotten and copied in one pass: the lock is held for
// a pass over them and nothing else of their number.
func (a *Aggregator) snapshotLocked(now time.Time, whole bool) snapshot {
	s := snapshot{now: now, procs: make([]*proc, 0, len(a.procs))}
	for subject, p := range a.procs {
		if p.silent(now, a.forget) {
			delete(a.procs, subject)
			continue
		}
		s.procs = append(s.procs, p)
	}
	a.expireLeasesLocked(now)
	if !whole {
		return s
	}
	s.leases = make([]keyedLease, 0, len(a.computing))
	for key, l := range a.computing {
		s.leases = append(s.leases, keyedLease{key, l})
	}
	s.election, s.lagSeen, s.history = a.election, a.lagSeen, slices.Clone(a.history)
	if len(a.dropped) > 0 {
		s.dropped = maps.Clone(a.dropped)
	}
	return s
}

// view builds the View; reconciler says whether it shows the
// reconciler's (WithLeases, WithReconcilerLag), received is the
// summaries heard.
func (s *snapshot) view(reconciler bool, received uint64) View {
	v := View{Time: s.now, Processes: rowsOf(s.procs), Leases: make([]Lease, 0, len(s.leases)),
		History: s.history, Received: received, Dropped: s.dropped}
	v.Totals = totalsOf(v.Processes)
	slices.SortFunc(v.Processes, func(x, y Process) int {
		return cmp.Or(cmp.Compare(x.Node, y.Node), cmp.Compare(x.Role, y.Role), cmp.Compare(x.ID, y.ID))
	})
	for _, k := range s.leases {
		v.Leases = append(v.Leases, k.l.view(k.key, s.now))
	}
	slices.SortFunc(v.Leases, func(x, y Lease) int {
		return cmp.Or(x.Started.Compare(y.Started), cmp.Compare(x.Key, y.Key))
	})
	if reconciler {
		r := s.lagSeen
		if e := s.election; e != nil && !e.expired(s.now) {
			r.Owner, r.Node, r.Heartbeat = e.rec.Owner, holderOf(e.rec.Owner), e.rec.Heartbeat
		}
		v.Reconciler = &r
	}
	return v
}

// rowsOf are the processes as a View's rows, in no order.
func rowsOf(procs []*proc) []Process {
	rows := make([]Process, len(procs))
	for i, p := range procs {
		rows[i] = p.view()
	}
	return rows
}

// totalsOf sums the rows.
func totalsOf(rows []Process) Totals {
	t := Totals{Counters: newCounters(), Rates: newRates()}
	for i := range rows {
		pv := &rows[i]
		t.Processes++
		if pv.Degraded {
			t.Degraded++
		}
		t.Held += pv.Held
		t.Pinned += pv.Pinned
		t.Counters.add(pv.Counters)
		t.Rates.add(pv.Rates)
	}
	t.Rates.HitRatio = ratio(t.Rates.Saved, t.Rates.Total)
	t.HitRatio = ratio(float64(t.Counters.Saved), float64(t.Counters.Total))
	return t
}
