package liveui

import (
	"context"
	"sync"
	"time"

	"github.com/embcache/embcache/live"
)

// Start makes the Aggregator a Lazy runs, with what it needs of its own
// (serve's: a NATS connection); release frees that, once the Aggregator
// has stopped.
type Start func() (agg *live.Aggregator, release func(), err error)

// Lazy runs an Aggregator only while someone looks: from the first View
// until idle passes without one. A process that serves the page (serve)
// then hears every summary and lease change only while it is open.
type Lazy struct {
	start Start
	idle  time.Duration
	clock live.Clock
	runs  sync.WaitGroup // the run goroutines, stopped or not

	mu      sync.Mutex
	running bool             // a run is starting or running the Aggregator; guarded by mu
	agg     *live.Aggregator // the running Aggregator, nil while it starts; guarded by mu
	stop    context.CancelFunc
	lastUse time.Time // guarded by mu
	closed  bool      // guarded by mu
}

// NewLazy returns a Lazy that makes its Aggregator with start and stops
// it (and releases what start made) after idle without a View.
func NewLazy(start Start, idle time.Duration) *Lazy {
	return &Lazy{start: start, idle: idle, clock: systemClock{}}
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// View starts the Aggregator if it is not running and returns its View:
// an empty one while it starts (start runs on a goroutine of its own,
// not under the Lazy's lock: it may dial), if it cannot start (the next
// View tries again), and after Close.
func (l *Lazy) View() live.View {
	l.mu.Lock()
	l.lastUse = l.clock.Now()
	if !l.running && !l.closed {
		ctx, cancel := context.WithCancel(context.Background())
		l.running, l.stop = true, cancel
		l.runs.Add(1)
		go l.run(ctx)
	}
	agg := l.agg
	l.mu.Unlock()
	if agg == nil {
		return live.View{Time: l.clock.Now(), Processes: []live.Process{}, Leases: []live.Lease{}}
	}
	return agg.View()
}

// run starts an Aggregator and runs it until ctx ends or it has not
// been looked at for idle, then releases what it held.
func (l *Lazy) run(ctx context.Context) {
	defer l.runs.Done()
	agg, release, err := l.start()
	if err != nil {
		l.stopped()
		return
	}
	defer release()
	l.mu.Lock()
	if l.closed { // meanwhile
		l.mu.Unlock()
		return
	}
	l.agg = agg
	l.mu.Unlock()
	actx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		agg.Run(actx)
	}()
	defer func() {
		cancel()
		<-ran
	}()
	t := time.NewTicker(max(l.idle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ran:
			l.stopped() // it failed: the next View starts another
			return
		case <-t.C:
			if l.stopIfIdle() {
				return
			}
		}
	}
}

// stopIfIdle says that the run's Aggregator no longer runs if it has not
// been looked at for idle, and reports whether it did: decided under the
// lock a View takes, so that no View that would keep it comes between.
func (l *Lazy) stopIfIdle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clock.Now().Sub(l.lastUse) <= l.idle {
		return false
	}
	l.running, l.agg = false, nil
	return true
}

// stopped says that the run's Aggregator no longer runs (or never
// started): the next View starts another, while this one is released.
func (l *Lazy) stopped() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running, l.agg = false, nil
}

// Close stops the Aggregator, waits for it and for what it held to be
// released, and keeps it from starting again.
func (l *Lazy) Close() {
	l.mu.Lock()
	l.closed, l.agg = true, nil
	stop := l.stop
	l.mu.Unlock()
	if stop != nil {
		stop()
	}
	l.runs.Wait()
}
