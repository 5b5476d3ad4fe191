package liveui

import (
	"context"
	"sync"
	"time"

	"github.com/embcache/embcache/live"
)

// Lazy runs an Aggregator only while someone looks: from the first View
// until idle passes without one. A process that serves the page (serve)
// then hears every summary and lease change only while it is open.
type Lazy struct {
	newAgg func() (*live.Aggregator, error)
	idle   time.Duration
	clock  live.Clock

	mu      sync.Mutex
	agg     *live.Aggregator // nil while stopped; guarded by mu
	stop    context.CancelFunc
	done    chan struct{}
	lastUse time.Time // guarded by mu
	closed  bool      // guarded by mu
}

// NewLazy returns a Lazy that makes its Aggregator with newAgg and stops
// it after idle without a View.
func NewLazy(newAgg func() (*live.Aggregator, error), idle time.Duration) *Lazy {
	return &Lazy{newAgg: newAgg, idle: idle, clock: systemClock{}}
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// View starts the Aggregator if it is not running and returns its View
// (an empty one if it cannot start, or after Close).
func (l *Lazy) View() live.View {
	l.mu.Lock()
	l.lastUse = l.clock.Now()
	if l.agg == nil && !l.closed {
		if agg, err := l.newAgg(); err == nil {
			ctx, cancel := context.WithCancel(context.Background())
			l.agg, l.stop, l.done = agg, cancel, make(chan struct{})
			go l.run(ctx, agg, l.done)
		}
	}
	agg := l.agg
	l.mu.Unlock()
	if agg == nil {
		return live.View{Time: l.clock.Now(), Processes: []live.Process{}, Leases: []live.Lease{}}
	}
	return agg.View()
}

// run runs agg until ctx ends or it has not been looked at for idle.
func (l *Lazy) run(ctx context.Context, agg *live.Aggregator, done chan struct{}) {
	defer close(done)
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
			l.mu.Lock()
			l.agg = nil // it failed: the next View starts another
			l.mu.Unlock()
			return
		case <-t.C:
			l.mu.Lock()
			if l.clock.Now().Sub(l.lastUse) > l.idle {
				l.agg = nil
				l.mu.Unlock()
				return
			}
			l.mu.Unlock()
		}
	}
}

// Close stops the Aggregator and waits for it.
func (l *Lazy) Close() {
	l.mu.Lock()
	l.closed, l.agg = true, nil
	stop, done := l.stop, l.done
	l.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}
