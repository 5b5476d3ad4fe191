//go:build mooncake && cgo

package mooncake

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/embcache/embcache/payload"
)

// call runs c, a call into the library, unless the master is known not to
// answer, and waits for it until ctx ends or its time is up (CallTimeout,
// plus a second per 100 MiB of size): then the error is ctx's, or
// ErrMasterUnreachable, and c is left to finish on its own goroutine, which
// runs abandon with its return code once it has (the memory the call uses
// is freed there, and Close waits for it). Otherwise call returns c's code
// and abandon does not run: what c used is the caller's to free.
func (s *Store) call(ctx context.Context, op string, size int64, c func() int64, abandon func(int64)) (int64, error) {
	if err := s.use(); err != nil {
		abandon(0)
		return 0, err
	}
	var (
		mu               sync.Mutex
		rc               int64
		finished, gaveUp bool
	)
	ended := make(chan struct{})
	go func() {
		defer s.done()
		r := c()
		mu.Lock()
		rc, finished = r, true
		left := gaveUp
		mu.Unlock()
		close(ended)
		if left {
			abandon(r)
		}
	}()
	limit := s.cfg.CallTimeout + time.Duration(size/(100<<20))*time.Second
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var err error
	select {
	case <-ended:
	case <-ctx.Done():
		err = context.Cause(ctx)
	case <-timer.C:
		err = &timeoutError{op: op, after: limit}
	}
	mu.Lock()
	defer mu.Unlock()
	if finished {
		return rc, nil
	}
	gaveUp = true
	if ctx.Err() == nil {
		err = s.trip(err)
	}
	return 0, err
}

// failed is the error of a call that returned code: a *CodeError, or, if
// the code says the master did not answer, ErrMasterUnreachable with it.
func (s *Store) failed(op string, code int64) error {
	err := &CodeError{Op: op, Code: code}
	if masterDown(code) {
		return s.trip(err)
	}
	return err
}

// masterCheck asks the master whether it answers, after a call failed
// with a code that does not say (register_buffer, which a master that
// went away fails with -600): if it does not, err becomes the outage's,
// which names the master, and the calls after it fail at once.
func (s *Store) masterCheck(ctx context.Context, err error) error {
	key := newKey(probeKey)
	rc, cerr := s.call(ctx, "is_exist", 0, func() int64 { return s.lib.isExist(key) }, func(int64) { key.free() })
	if cerr != nil {
		return cerr // the outage's (refused, or the call timed out), or ctx's
	}
	key.free()
	if rc < 0 && masterDown(rc) {
		return s.trip(err)
	}
	return err
}

// trip records that the master does not answer (cause says how a call
// found it so) and starts the probe that waits until it does; the error
// returned names the master.
func (s *Store) trip(cause error) error {
	err := &masterError{master: s.cfg.MasterServerAddr, since: time.Now(), cause: cause}
	s.mu.Lock()
	if s.outage != nil || s.closed {
		s.mu.Unlock()
		return err
	}
	s.outage = err
	s.probing.Add(1)
	go s.probe()
	s.mu.Unlock()
	s.cfg.Logger.Warn("mooncake: master unreachable, calls fail at once until it answers",
		"master", s.cfg.MasterServerAddr, "err", err)
	return err
}

// probe asks the master whether it answers (is_exist of probeKey) every
// probeEvery until it does, then lets calls through again. One call at a
// time: each runs to its end, however long the library takes.
func (s *Store) probe() {
	defer s.probing.Done()
	key := newKey(probeKey)
	defer key.free()
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		s.ops.Add(1) // use would refuse it: the master is down
		s.mu.Unlock()
		rc := s.lib.isExist(key)
		s.done()
		if rc < 0 && masterDown(rc) {
			continue
		}
		s.mu.Lock()
		down := time.Since(s.outage.since)
		s.outage = nil
		s.mu.Unlock()
		s.cfg.Logger.Warn("mooncake: master answers again", "master", s.cfg.MasterServerAddr,
			"unreachable_for", down.Round(time.Millisecond))
		return
	}
}

// refusedLocked is the error a call fails with now (closed, or the
// master unreachable), or nil; s.mu is held.
func (s *Store) refusedLocked() error {
	if s.closed {
		return fmt.Errorf("mooncake: %w", payload.ErrClosed)
	}
	if s.outage != nil {
		fast := *s.outage
		fast.fast = true
		return &fast
	}
	return nil
}

// use admits a call unless the store is closed or the master is known not
// to answer; done ends it.
func (s *Store) use() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.refusedLocked(); err != nil {
		return err
	}
	s.ops.Add(1)
	return nil
}

func (s *Store) done() { s.ops.Done() }

// probeEvery is how often a Store whose master does not answer asks it
// again (is_exist of probeKey, no object read).
const (
	probeEvery = 500 * time.Millisecond
	probeKey   = "embcache/probe"
)
