package live

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/nats-io/nats.go"
)

// Aggregator keeps the latest summary of every process it hears and
// makes Views of them. Run subscribes; View may be called at any time.
type Aggregator struct {
	nc        *nats.Conn
	clock     Clock
	tenant    string
	forget    int           // intervals without a summary before a process is forgotten
	sample    time.Duration // how often Run samples the history
	keep      int           // history points kept
	leases    bool          // follow the leases computing now
	lag       bool          // ask the reconciler's consumer for its lag
	lagPoller *lagPoller

	mu         sync.Mutex
	procs      map[string]*proc  // by subject; guarded by mu
	computing  map[string]*held  // by key; guarded by mu
	ended      map[string]ended  // by key: what ended the leases ended lately; guarded by mu
	longestTTL time.Duration     // the longest lease TTL heard; guarded by mu
	election   *held             // the reconciler's election record; guarded by mu
	lagSeen    Reconciler        // the lag's last answer; guarded by mu
	history    []Point           // guarded by mu
	dropped    map[string]uint64 // guarded by mu
	received   atomic.Uint64
}

// proc is one process: its last summary and the rates up to it. Receive
// replaces a process's proc with a new one, and never changes a proc or
// what it holds once stored: a snapshot keeps pointers to them.
type proc struct {
	last  *Summary
	heard time.Time // by the Aggregator's clock
	rates Rates
	seen  uint64 // summaries heard since the last restart (for Missed)
	first uint64 // the seq of the first of them
}

// AggregatorOption configures an Aggregator.
type AggregatorOption func(*Aggregator) error

// WithAggregatorClock sets the clock processes' silence and leases' ages
// are measured with.
func WithAggregatorClock(c Clock) AggregatorOption {
	return func(a *Aggregator) error {
		if c == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidOption)
		}
		a.clock = c
		return nil
	}
}

// WithTenantOnly hears only the processes and leases of one tenant (an
// operator whose NATS user may subscribe to no other's).
func WithTenantOnly(tenant string) AggregatorOption {
	return func(a *Aggregator) error {
		if tenant == "" {
			return fmt.Errorf("%w: empty tenant", ErrInvalidOption)
		}
		a.tenant = tenant
		return nil
	}
}

// WithForgetAfter sets after how many of its intervals without a summary
// a process is forgotten (default 3).
func WithForgetAfter(intervals int) AggregatorOption {
	return func(a *Aggregator) error {
		if intervals < 1 {
			return fmt.Errorf("%w: forget after %d intervals", ErrInvalidOption, intervals)
		}
		a.forget = intervals
		return nil
	}
}

// WithHistory keeps span of once-a-second samples of the totals' rates
// (default 5 minutes).
func WithHistory(span time.Duration) AggregatorOption {
	return func(a *Aggregator) error {
		if span < time.Second {
			return fmt.Errorf("%w: history span %v", ErrInvalidOption, span)
		}
		a.keep = int(span / a.sample)
		return nil
	}
}

// WithLeases follows the leases computing now: it subscribes to what the
// lease bucket's streams republish (lease.StoredWildcard), every record
// write of the cluster (docs/scaling.md 5 says what that costs).
func WithLeases() AggregatorOption {
	return func(a *Aggregator) error { a.leases = true; return nil }
}

// WithReconcilerLag asks the event stream's durable consumer, once a
// second, how far the active reconciler is behind.
func WithReconcilerLag() AggregatorOption {
	return func(a *Aggregator) error { a.lag = true; return nil }
}

// NewAggregator returns an Aggregator over nc (which the caller keeps
// and closes).
func NewAggregator(nc *nats.Conn, opts ...AggregatorOption) (*Aggregator, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidOption)
	}
	a := &Aggregator{nc: nc, clock: systemClock{}, forget: 3, sample: time.Second, keep: 300,
		procs: map[string]*proc{}, computing: map[string]*held{}, ended: map[string]ended{}, dropped: map[string]uint64{}}
	for _, opt := range opts {
		if err := opt(a); err != nil {
			return nil, err
		}
	}
	if a.lag {
		p, err := newLagPoller(nc)
		if err != nil {
			return nil, err
		}
		a.lagPoller = p
	}
	return a, nil
}

// Run subscribes and, until ctx ends, samples the history once a second
// (and asks for the reconciler's lag). It returns ctx's error, or the
// subscription's (a closed connection, a bad subject).
func (a *Aggregator) Run(ctx context.Context) error {
	sub, err := a.nc.Subscribe(TenantSubjects(a.tenant), func(m *nats.Msg) { a.Receive(m.Subject, m.Data) })
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if a.leases {
		subject := lease.StoredWildcard
		if a.tenant != "" {
			subject = lease.StoredTenantWildcard(a.tenant)
		}
		ls, err := a.nc.Subscribe(subject, a.receiveStored)
		if err != nil {
			return err
		}
		defer ls.Unsubscribe()
		if a.tenant != "" { // the election record is no tenant's
			es, err := a.nc.Subscribe(lease.StoredKeysWildcard(electionKey), a.receiveStored)
			if err != nil {
				return err
			}
			defer es.Unsubscribe()
		}
	}
	// The subscriptions are in place once the server has them. A
	// connection that is down now sends them when it is back: not an
	// error, the view is empty meanwhile.
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	a.nc.FlushWithContext(fctx)
	cancel()
	t := time.NewTicker(a.sample)
	defer t.Stop()
	for {
		a.Sample()
		if a.lagPoller != nil {
			r := a.lagPoller.poll(ctx, a.clock.Now())
			a.mu.Lock()
			a.lagSeen = r
			a.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Receive takes one summary as it came on subject. One that does not
// decode, or of another version, is counted in View.Dropped.
func (a *Aggregator) Receive(subject string, body []byte) {
	a.received.Add(1)
	s, err := Decode(subject, body)
	now := a.clock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		reason := "bad"
		if errors.Is(err, ErrVersion) {
			reason = "version"
		}
		a.dropped[reason]++
		return
	}
	old := a.procs[subject]
	var p proc
	switch {
	case old == nil && len(a.procs) >= MaxProcesses:
		a.dropped["full"]++
		return
	case old == nil, s.Start != old.last.Start:
		// New, or the same id started again: its counters start from zero.
		p = proc{first: s.Seq, rates: ratesSinceStart(s)}
	case s.Seq <= old.last.Seq:
		return // late or twice: the newer one is kept
	default:
		p = *old
		p.rates = ratesBetween(old.last, s)
	}
	p.last, p.heard = s, now
	p.seen++
	a.procs[subject] = &p
}

// MaxProcesses bounds the processes an Aggregator follows: a summary of
// one more is dropped (View.Dropped["full"]). It is well above the
// 8000 processes of docs/scaling.md.
const MaxProcesses = 100_000

// Sample forgets the processes and leases not heard from in time, and
// adds a point to the history. The totals are summed outside the lock,
// as View's are.
func (a *Aggregator) Sample() {
	now := a.clock.Now()
	a.mu.Lock()
	s := a.snapshotLocked(now, false)
	a.mu.Unlock()
	t := totalsOf(rowsOf(s.procs))
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := len(a.history); n > 0 && a.history[n-1].Time.After(now) {
		return // a Sample taken later has added its point meanwhile
	}
	a.history = append(a.history, Point{Time: now, Total: t.Rates.Total, Saved: t.Rates.Saved,
		Forwards: t.Rates.Forwards, HitRatio: t.Rates.HitRatio})
	if len(a.history) > a.keep {
		a.history = slices.Delete(a.history, 0, len(a.history)-a.keep)
	}
}

// silent reports whether p has been silent at now for forget of its
// intervals: it is forgotten.
func (p *proc) silent(now time.Time, forget int) bool {
	return now.Sub(p.heard) > time.Duration(forget)*time.Duration(p.last.Every)*time.Millisecond
}

// expireLeasesLocked forgets leases past their TTL, and ended leases no
// late record can bring back.
func (a *Aggregator) expireLeasesLocked(now time.Time) {
	for key, l := range a.computing {
		if l.expired(now) {
			delete(a.computing, key)
		}
	}
	for key, e := range a.ended {
		if e.outlived(now, a.longestTTL) {
			delete(a.ended, key)
		}
	}
}

// View returns the cluster as heard now. It holds the Aggregator's lock
// only to copy what it is made of (snapshotLocked): Receive, the NATS
// handler, does not wait while it is built.
func (a *Aggregator) View() View {
	now := a.clock.Now()
	a.mu.Lock()
	s := a.snapshotLocked(now, true)
	a.mu.Unlock()
	return s.view(a.leases || a.lag, a.received.Load())
}

// view is p as a View's row.
func (p *proc) view() Process {
	s := p.last
	var missed uint64
	if span := s.Seq - p.first + 1; span > p.seen {
		missed = span - p.seen
	}
	pv := Process{Node: s.Node, ID: s.ID, Role: s.Role, Tenant: s.Tenant, PID: s.PID, Version: s.Version,
		Started: time.Unix(0, s.Start), Heard: p.heard, Seq: s.Seq, Missed: missed, Unsent: s.Unsent,
		Held: s.Held, Pinned: s.Pinned, StoreDown: s.StoreDown, Counters: countersOf(s), Rates: p.rates,
		Reconciler: s.Reconciler}
	pv.Degraded = s.StoreDown || p.rates.Degraded > 0
	return pv
}
