package lease

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// Callers that ask for a tombstone while a read of it is in flight share
// the next read, sent after that one is answered: never the one in flight,
// which may have left before an invalidation they must see.
func TestSharedReadsAnswerEachCallerWithALaterRead(t *testing.T) {
	var s sharedReads[uint64]
	id := sharedReadID{0, "acme.inv.x"}
	var mu sync.Mutex
	reads := 0
	release := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	started := make(chan int, 3)
	read := func(context.Context) (uint64, error) {
		mu.Lock()
		reads++
		n := reads
		mu.Unlock()
		started <- n
		<-release[n-1]
		return uint64(n), nil // the read's number: later reads see later state
	}
	ctx := context.Background()
	got := make(chan [2]uint64, 4) // caller, answer
	call := func(caller uint64) { rev, _ := s.do(ctx, id, read); got <- [2]uint64{caller, rev} }
	joined := func(n int) { // polls the group: no caller order is assumed
		for {
			s.mu.Lock()
			g := s.groups[id]
			ok := g != nil && g.next != nil && g.next.joiners == n
			s.mu.Unlock()
			if ok {
				return
			}
			runtime.Gosched()
		}
	}
	go call(1)
	if n := <-started; n != 1 {
		t.Fatalf("read %d first", n)
	}
	go call(2)
	go call(3)
	joined(2) // callers 2 and 3 wait for the next read
	close(release[0])
	if a := <-got; a != [2]uint64{1, 1} {
		t.Fatalf("caller 1 got %v, want read 1", a)
	}
	if n := <-started; n != 2 { // sent once read 1 was answered
		t.Fatalf("read %d second", n)
	}
	go call(4) // read 2 is in flight: caller 4 needs read 3
	joined(1)
	close(release[1])
	for range 2 {
		if a := <-got; a[1] != 2 || (a[0] != 2 && a[0] != 3) {
			t.Fatalf("callers 2 and 3 got %v, want read 2", a)
		}
	}
	if n := <-started; n != 3 {
		t.Fatalf("read %d third", n)
	}
	close(release[2])
	if a := <-got; a != [2]uint64{4, 3} {
		t.Fatalf("caller 4 got %v, want read 3", a)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.groups) != 0 || reads != 3 {
		t.Fatalf("after the reads: %d groups left, %d reads", len(s.groups), reads)
	}
}

// A read that panics is an error for its caller and for the callers that
// joined the next read, and the key's reads go on: left in flight, it
// held every later caller until its deadline.
func TestASharedReadThatPanicsIsAnError(t *testing.T) {
	var s sharedReads[uint64]
	id := sharedReadID{0, "acme.inv.x"}
	entered, release := make(chan struct{}), make(chan struct{})
	first := true
	read := func(context.Context) (uint64, error) {
		if first {
			first = false
			close(entered)
			<-release
			panic("boom")
		}
		return 7, nil
	}
	ctx := context.Background()
	// One channel each: the next read may answer its joiner before the
	// caller of the one that panicked has returned.
	panicked, next := make(chan error, 1), make(chan error, 1)
	go func() { _, err := s.do(ctx, id, read); panicked <- err }()
	<-entered
	go func() { _, err := s.do(ctx, id, read); next <- err }() // joins the next read
	for {
		s.mu.Lock()
		joined := s.groups[id].next != nil && s.groups[id].next.joiners == 1
		s.mu.Unlock()
		if joined {
			break
		}
		runtime.Gosched()
	}
	close(release)
	if err := <-panicked; err == nil {
		t.Fatal("the read that panicked answered without an error")
	}
	if err := <-next; err != nil {
		t.Fatalf("the next read: %v", err)
	}
	if rev, err := s.do(ctx, id, read); rev != 7 || err != nil {
		t.Fatalf("a later read: %d %v", rev, err)
	}
}

// Close cancels a follow-on in flight (a read sent on the Bucket's own
// goroutine for the callers that joined it) and returns only once it has
// ended; its callers, and a caller that joined the one after it, get
// ErrClosed. After it, a caller that would join a read in flight gets
// ErrClosed at once, and no read is sent for it. (Before Close, a
// follow-on outlived Cache.Close by up to its deadline, using the
// connection.)
func TestClosedSharedReadsCancelTheirFollowOnAndSendNoMore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s sharedReads[uint64]
		id := sharedReadID{0, "acme.inv.x"}
		release1, release3 := make(chan struct{}), make(chan struct{})
		cancelled, hold := make(chan struct{}), make(chan struct{})
		var reads atomic.Int32
		read := func(ctx context.Context) (uint64, error) {
			n := reads.Add(1)
			switch n {
			case 1: // the first caller's own
				<-release1
			case 2: // the follow-on, held past its cancellation
				<-ctx.Done()
				close(cancelled)
				<-hold
				return 0, ctx.Err()
			case 3: // a caller's own, after close
				<-release3
			}
			return uint64(n), nil
		}
		type answer struct {
			rev uint64
			err error
		}
		// No deadline: the follow-on gets sharedReadTimeout, which the
		// bubble's clock would reach if nothing cancelled it.
		call := func() <-chan answer {
			c := make(chan answer, 1)
			go func() { rev, err := s.do(t.Context(), id, read); c <- answer{rev, err} }()
			return c
		}
		first := call()
		synctest.Wait() // in read 1
		joined := call()
		synctest.Wait() // joined read 2
		close(release1)
		if a := <-first; a.rev != 1 || a.err != nil {
			t.Fatalf("the first caller got %+v, want read 1", a)
		}
		synctest.Wait() // read 2 in flight, on the follow-on's goroutine
		later := call()
		synctest.Wait() // joined read 3, to be sent after read 2

		closed := []chan struct{}{make(chan struct{}), make(chan struct{})}
		for _, c := range closed { // at once, and twice
			go func() { s.close(); close(c) }()
		}
		<-cancelled
		synctest.Wait() // each close as far as it goes while read 2 is held
		for _, c := range closed {
			select {
			case <-c:
				t.Fatal("close returned before its follow-on ended")
			default:
			}
		}
		close(hold)
		for _, c := range closed {
			<-c
		}
		if a := <-joined; !errors.Is(a.err, ErrClosed) || !errors.Is(a.err, context.Canceled) {
			t.Fatalf("the caller of the cancelled read got %+v, want ErrClosed", a)
		}
		if a := <-later; !errors.Is(a.err, ErrClosed) {
			t.Fatalf("the caller of the read after it got %+v, want ErrClosed", a)
		}

		own := call()
		synctest.Wait() // in read 3, its own: a caller's read is made after close
		if _, err := s.do(t.Context(), id, read); !errors.Is(err, ErrClosed) {
			t.Fatalf("a caller that would join a read after close got %v, want ErrClosed", err)
		}
		close(release3)
		if a := <-own; a.rev != 3 || a.err != nil {
			t.Fatalf("the caller of its own read after close got %+v, want read 3", a)
		}
		synctest.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		if n := reads.Load(); n != 3 || len(s.groups) != 0 {
			t.Fatalf("after close: %d reads, %d groups left; want 3 and none", n, len(s.groups))
		}
	})
}
