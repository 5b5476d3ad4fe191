package live

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/fakeclock"
	"github.com/nats-io/nats.go"
)

// feed is one process's summaries, sent to an Aggregator as they would
// come: each one's time by the process's clock, which is also the
// Aggregator's here.
type feed struct {
	t     *testing.T
	a     *Aggregator
	clock *fakeclock.Clock
	s     Summary
}

func newFeed(t *testing.T, a *Aggregator, clock *fakeclock.Clock, node, id string) *feed {
	return &feed{t: t, a: a, clock: clock, s: Summary{V: Version, Node: node, ID: id, Role: RoleWorker,
		Start: clock.Now().UnixNano(), Every: 1000, Requests: map[string]uint64{}}}
}

// send publishes the summary with requests by path and forwards.
func (f *feed) send(req map[string]uint64, forwards uint64) {
	f.t.Helper()
	f.s.Seq++
	f.s.Time = f.clock.Now().UnixNano()
	f.s.Requests, f.s.Forwards = req, forwards
	body, err := Encode(&f.s)
	if err != nil {
		f.t.Fatal(err)
	}
	f.a.Receive(Subject(f.s.Tenant, f.s.Node, f.s.ID), body)
}

func newTestAggregator(t *testing.T, clock *fakeclock.Clock) *Aggregator {
	t.Helper()
	// The connection is never used: Receive and View are called directly.
	a, err := NewAggregator(&nats.Conn{}, WithAggregatorClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func near(x, want float64) bool { return math.Abs(x-want) < 1e-9 }

func TestRatesFromCounterDeltas(t *testing.T) {
	clock := newFakeClock()
	a := newTestAggregator(t, clock)
	w1, w2 := newFeed(t, a, clock, "n1", "a"), newFeed(t, a, clock, "n2", "b")
	clock.Advance(5 * time.Second) // long after their start: no rate from a first summary
	w1.send(map[string]uint64{"local-hit": 100, "computed": 10}, 10)
	w2.send(map[string]uint64{"remote-hit": 50}, 0)
	v := a.View()
	if v.Totals.Processes != 2 || v.Totals.Rates.Total != 0 || v.Totals.Counters.Total != 160 || v.Totals.Counters.Saved != 150 {
		t.Fatalf("first summaries: %+v", v.Totals)
	}
	clock.Advance(2 * time.Second)
	w1.send(map[string]uint64{"local-hit": 140, "computed": 14, "waited": 6}, 14)
	w2.send(map[string]uint64{"remote-hit": 60}, 0)
	v = a.View()
	r := v.Totals.Rates
	// w1: 40 local hits, 4 computed, 6 waited in 2 s; w2: 10 remote hits.
	if !near(r.Total, 30) || !near(r.Saved, 28) || !near(r.Forwards, 2) || !near(r.Requests["local-hit"], 20) {
		t.Fatalf("rates %+v", r)
	}
	if r.HitRatio == nil || !near(*r.HitRatio, 28.0/30) {
		t.Fatalf("hit ratio %v", r.HitRatio)
	}
	if c := v.Totals.Counters; c.Total != 220 || c.Saved != 206 || c.Forwards != 14 || c.Requests["waited"] != 6 {
		t.Fatalf("counters %+v", c)
	}
	if len(v.Processes) != 2 || v.Processes[0].Node != "n1" || !near(v.Processes[1].Rates.Total, 5) {
		t.Fatalf("processes %+v", v.Processes)
	}
}

// TestRestartIsNoNegativeRate: a process whose counters go down started
// again; its rate counts from zero, never below.
func TestRestartIsNoNegativeRate(t *testing.T) {
	clock := newFakeClock()
	a := newTestAggregator(t, clock)
	w := newFeed(t, a, clock, "n1", "a")
	clock.Advance(5 * time.Second)
	w.send(map[string]uint64{"local-hit": 1000}, 50)
	clock.Advance(time.Second)
	w.send(map[string]uint64{"local-hit": 7}, 1) // a library Cache made anew under the same publisher
	r := a.View().Totals.Rates
	if !near(r.Total, 7) || !near(r.Forwards, 1) || *r.HitRatio > 1 {
		t.Fatalf("after a reset: %+v", r)
	}
	// Started again with a new start time: a new life, its rates from it.
	w.s.Start = clock.Now().UnixNano()
	w.s.Seq = 0
	clock.Advance(500 * time.Millisecond)
	w.send(map[string]uint64{"local-hit": 5}, 0)
	v := a.View()
	if !near(v.Totals.Rates.Total, 10) || v.Totals.Counters.Total != 5 || v.Processes[0].Seq != 1 {
		t.Fatalf("after a restart: %+v %+v", v.Totals, v.Processes)
	}
}

func TestLateSummaryIsIgnoredAndMissedCounted(t *testing.T) {
	clock := newFakeClock()
	a := newTestAggregator(t, clock)
	w := newFeed(t, a, clock, "n1", "a")
	w.send(map[string]uint64{"local-hit": 1}, 0)
	clock.Advance(time.Second)
	late := w.s // the second, kept back
	late.Seq++
	late.Time = clock.Now().UnixNano()
	late.Requests = map[string]uint64{"local-hit": 2}
	w.s.Seq++
	clock.Advance(time.Second)
	w.send(map[string]uint64{"local-hit": 3}, 0)
	body, _ := Encode(&late)
	a.Receive(Subject("", "n1", "a"), body)
	p := a.View().Processes[0]
	if p.Seq != 3 || p.Counters.Total != 3 || p.Missed != 1 {
		t.Fatalf("%+v", p)
	}
}

func TestSilentProcessesAreForgotten(t *testing.T) {
	clock := newFakeClock()
	a := newTestAggregator(t, clock)
	w1, w2 := newFeed(t, a, clock, "n1", "a"), newFeed(t, a, clock, "n2", "b")
	w1.send(map[string]uint64{"computed": 1}, 1)
	w2.send(map[string]uint64{"computed": 1}, 1)
	clock.Advance(2 * time.Second)
	w1.send(map[string]uint64{"computed": 1}, 1)
	clock.Advance(1500 * time.Millisecond) // w2 silent 3.5 intervals, w1 1.5
	v := a.View()
	if v.Totals.Processes != 1 || v.Processes[0].Node != "n1" {
		t.Fatalf("%+v", v.Processes)
	}
}

func TestJunkIsDroppedAndCounted(t *testing.T) {
	clock := newFakeClock()
	a := newTestAggregator(t, clock)
	a.Receive("embcache.sum.~.n1.a", []byte("junk"))
	v2 := newFeed(t, a, clock, "n1", "a")
	v2.s.V = 2
	v2.send(nil, 0)
	v := a.View()
	if v.Received != 2 || v.Dropped["bad"] != 1 || v.Dropped["version"] != 1 || v.Totals.Processes != 0 {
		t.Fatalf("%+v", v)
	}
}

// TestViewsWhileReceiving: Views and Samples are built from what they
// copied under the lock while Receive goes on replacing it (go test
// -race says whether a View reads what Receive writes).
func TestViewsWhileReceiving(t *testing.T) {
	clock := newFakeClock()
	a := newTestAggregator(t, clock)
	feeds := []*feed{newFeed(t, a, clock, "n1", "a"), newFeed(t, a, clock, "n2", "b")}
	for _, f := range feeds {
		f.send(map[string]uint64{"local-hit": 1}, 0)
	}
	// The next 200 summaries of each, encoded here (a test's goroutine
	// may fail it), received on another.
	type msg struct {
		subject string
		body    []byte
	}
	var msgs []msg
	for i := range uint64(200) {
		for _, f := range feeds {
			f.s.Seq++
			f.s.Time = clock.Now().UnixNano()
			f.s.Requests, f.s.Forwards = map[string]uint64{"local-hit": i + 2, "computed": i}, i
			body, err := Encode(&f.s)
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, msg{Subject(f.s.Tenant, f.s.Node, f.s.ID), body})
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, m := range msgs {
			a.Receive(m.subject, m.body)
		}
	}()
	for range 50 {
		a.Sample()
		if v := a.View(); v.Totals.Processes != 2 || v.Totals.Counters.Total < 2 {
			t.Fatalf("%+v", v.Totals)
		}
	}
	<-done
	if c := a.View().Totals.Counters; c.Requests["local-hit"] != 2*201 || c.Forwards != 2*199 {
		t.Fatalf("after the last summaries: %+v", c)
	}
}

// TestPublisherToAggregator: a real server; what the Aggregator shows is
// the sum of what the sources counted.
func TestPublisherToAggregator(t *testing.T) {
	s := startServer(t)
	nc, a := runAggregator(t, s.ClientURL())
	var pubs []*Publisher
	for i, node := range []string{"n1", "n2", "n3"} {
		n := uint64(i + 1)
		p, err := NewPublisher(nc, node, func() Summary {
			return Summary{Requests: map[string]uint64{"local-hit": 10 * n, "computed": n}, Forwards: n,
				Pulled: map[string]uint64{"http": 100 * n}}
		}, WithInterval(time.Second), WithVersion("test"))
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, p)
	}
	// The Aggregator hears what is published once its subscription is in.
	waitFor(t, "all three heard", func() bool {
		for _, p := range pubs {
			p.Publish()
		}
		return a.View().Totals.Processes == 3
	})
	c := a.View().Totals.Counters
	if c.Total != 66 || c.Forwards != 6 || c.Saved != 60 || c.Pulled["http"] != 600 {
		t.Fatalf("totals %+v", c)
	}
	if st := pubs[0].Stats(); st.Sent == 0 || st.Failed != 0 {
		t.Fatalf("publisher %+v", st)
	}
}

// TestPublisherCountsFailures: a summary that cannot be sent is counted
// and carried in the next, and Publish returns at once.
func TestPublisherCountsFailures(t *testing.T) {
	s := startServer(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPublisher(nc, "n1", func() Summary { return Summary{} })
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	for range 3 {
		if err := p.Publish(); !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("publish on a closed connection: %v", err)
		}
	}
	if st := p.Stats(); st.Failed != 3 || st.Sent != 0 {
		t.Fatalf("%+v", st)
	}
	if s := p.Take(); s.Unsent != 3 || s.Seq != 4 {
		t.Fatalf("next summary %+v", s)
	}
}

func TestOptionsAreValidated(t *testing.T) {
	src := func() Summary { return Summary{} }
	for name, err := range map[string]error{
		"nil conn": func() error { _, err := NewPublisher(nil, "n", src); return err }(),
		"no node":  func() error { _, err := NewPublisher(&nats.Conn{}, "", src); return err }(),
		"interval": func() error {
			_, err := NewPublisher(&nats.Conn{}, "n", src, WithInterval(time.Millisecond))
			return err
		}(),
		"tenant":     func() error { _, err := NewPublisher(&nats.Conn{}, "n", src, WithTenant("a.b")); return err }(),
		"role":       func() error { _, err := NewPublisher(&nats.Conn{}, "n", src, WithRole("")); return err }(),
		"forget":     func() error { _, err := NewAggregator(&nats.Conn{}, WithForgetAfter(0)); return err }(),
		"agg conn":   func() error { _, err := NewAggregator(nil); return err }(),
		"agg tenant": func() error { _, err := NewAggregator(&nats.Conn{}, WithTenantOnly("")); return err }(),
	} {
		if !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// BenchmarkReceive is what a view spends per summary heard: decoding it
// and taking its rates (docs/scaling.md 5), over 8000 processes.
func BenchmarkReceive(b *testing.B) {
	clock := newFakeClock()
	a, err := NewAggregator(&nats.Conn{}, WithAggregatorClock(clock))
	if err != nil {
		b.Fatal(err)
	}
	const procs = 8000
	subjects, bodies := make([]string, procs), make([][]byte, procs)
	s := *sample()
	for i := range procs {
		s.Node, s.ID = fmt.Sprintf("gpu-%d", i/8), fmt.Sprintf("%016x", i)
		subjects[i] = Subject("", s.Node, s.ID)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p := i % procs
		if p == 0 {
			b.StopTimer()
			s.Seq++
			s.Time += int64(2 * time.Second)
			s.Requests["local-hit"] += 40
			for j := range procs {
				s.Node, s.ID = fmt.Sprintf("gpu-%d", j/8), fmt.Sprintf("%016x", j)
				bodies[j], _ = Encode(&s)
			}
			b.StartTimer()
		}
		a.Receive(subjects[p], bodies[p])
	}
}

// heardOf is an Aggregator that has heard n processes, and the subjects
// and bodies of their last summaries.
func heardOf(b *testing.B, n int) (*Aggregator, []string, [][]byte) {
	clock := newFakeClock()
	a, err := NewAggregator(&nats.Conn{}, WithAggregatorClock(clock))
	if err != nil {
		b.Fatal(err)
	}
	s := *sample()
	s.Time = clock.Now().UnixNano()
	subjects, bodies := make([]string, n), make([][]byte, n)
	for i := range n {
		s.Node, s.ID = fmt.Sprintf("gpu-%d", i/8), fmt.Sprintf("%016x", i)
		subjects[i] = Subject("", s.Node, s.ID)
		bodies[i], _ = Encode(&s)
		a.Receive(subjects[i], bodies[i])
	}
	return a, subjects, bodies
}

// BenchmarkView is a view of 8000 processes: what top and the page ask
// for once a second.
func BenchmarkView(b *testing.B) {
	a, _, _ := heardOf(b, 8000)
	for b.Loop() {
		if len(a.View().Processes) != 8000 {
			b.Fatal("processes")
		}
	}
}

// viewUnderLock is View as it was: the whole view built under the
// Aggregator's lock. The benchmarks below compare View with it.
func (a *Aggregator) viewUnderLock() View {
	now := a.clock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.snapshotLocked(now, true)
	return s.view(a.leases || a.lag, a.received.Load())
}

// BenchmarkViewLockHold is how long a view of 8000 processes holds the
// Aggregator's lock (hold-ms/op), which Receive, the NATS handler, waits
// for: the whole build under it (as View was), or the copy (as View is).
func BenchmarkViewLockHold(b *testing.B) {
	for _, c := range []struct {
		name string
		view func(a *Aggregator) time.Duration // the hold
	}{
		{"build-under-lock", func(a *Aggregator) time.Duration {
			start := time.Now()
			a.mu.Lock()
			s := a.snapshotLocked(a.clock.Now(), true)
			s.view(false, 0)
			a.mu.Unlock()
			return time.Since(start)
		}},
		{"copy-under-lock", func(a *Aggregator) time.Duration {
			start := time.Now()
			a.mu.Lock()
			s := a.snapshotLocked(a.clock.Now(), true)
			a.mu.Unlock()
			held := time.Since(start)
			s.view(false, 0)
			return held
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			a, _, _ := heardOf(b, 8000)
			var held time.Duration
			n := 0
			for b.Loop() {
				held += c.view(a)
				n++
			}
			b.ReportMetric(float64(held.Microseconds())/1000/float64(n), "hold-ms/op")
		})
	}
}

// BenchmarkReceiveWhileViewing is Receive over 8000 processes while
// another goroutine makes views without pause: its longest wait
// (max-ms) is the longest the lock was held, with the whole build under
// it (viewUnderLock) or only the copy (View).
func BenchmarkReceiveWhileViewing(b *testing.B) {
	for _, c := range []struct {
		name string
		view func(a *Aggregator) View
	}{
		{"build-under-lock", (*Aggregator).viewUnderLock},
		{"copy-under-lock", (*Aggregator).View},
	} {
		b.Run(c.name, func(b *testing.B) {
			a, subjects, bodies := heardOf(b, 8000)
			stop, stopped := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(stopped)
				for {
					select {
					case <-stop:
						return
					default:
						c.view(a)
					}
				}
			}()
			var longest time.Duration
			for i := 0; b.Loop(); i++ {
				start := time.Now()
				a.Receive(subjects[i%len(subjects)], bodies[i%len(bodies)])
				longest = max(longest, time.Since(start))
			}
			close(stop)
			<-stopped
			b.ReportMetric(float64(longest.Microseconds())/1000, "max-ms")
		})
	}
}
