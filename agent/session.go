package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/payload"
)

// session is what one connection holds: the pins of its requests and its
// open reservations (with their slots). When the connection closes, end
// gives all of it back.
type session struct {
	s *Server

	mu    sync.Mutex
	ended bool
	reqs  map[string]struct{}     // pin names this connection looked up
	res   map[string]*reservation // open reservations
}

func (se *session) pinned(pin string) {
	se.mu.Lock()
	se.reqs[pin] = struct{}{}
	se.mu.Unlock()
}

func (se *session) unpinned(pin string) {
	se.mu.Lock()
	delete(se.reqs, pin)
	se.mu.Unlock()
}

// end releases everything the connection held.
func (se *session) end() {
	se.mu.Lock()
	if se.ended {
		se.mu.Unlock()
		return
	}
	se.ended = true
	reqs, res := se.reqs, se.res
	se.reqs, se.res = nil, nil
	se.mu.Unlock()
	if len(reqs)+len(res) > 0 {
		se.s.disconnects.Add(1)
	}
	for _, r := range res {
		if r.deliver(nil, fmt.Errorf("%w: its connection closed", errReservationEnded)) {
			se.s.abandons.Add(1)
			se.s.logger.Info("embcache agent: client gone, reservation abandoned", "key", r.ref.String())
		}
	}
	for pin := range reqs {
		se.s.cache.Release(pin)
	}
}

// reservation is a compute the agent handed to a client: the coordinator's
// compute function waits in await until the client commits or abandons.
type reservation struct {
	id   string
	ref  coordinator.Ref
	sess *session
	s    *Server

	once   sync.Once
	result chan reservationResult // buffered 1

	mu    sync.Mutex
	ended bool
	slots map[string]string // slot name -> file, until a commit takes one
}

// addSlot records a slot file; false if the reservation has ended.
func (r *reservation) addSlot(name, path string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return false
	}
	r.slots[name] = path
	return true
}

// takeSlot hands a slot's file over to a commit.
func (r *reservation) takeSlot(name string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.slots[name]
	delete(r.slots, name)
	return p, ok
}

func (r *reservation) slotCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.slots)
}

type reservationResult struct {
	v   *payload.Value
	err error
}

func (s *Server) newReservation(sess *session, ref coordinator.Ref) *reservation {
	r := &reservation{id: randomID(), ref: ref, sess: sess, s: s, result: make(chan reservationResult, 1), slots: map[string]string{}}
	s.mu.Lock()
	s.reservations[r.id] = r
	s.mu.Unlock()
	sess.mu.Lock()
	ended := sess.ended
	if !ended {
		sess.res[r.id] = r
	}
	sess.mu.Unlock()
	if ended { // the client left while the agent waited for the key
		r.deliver(nil, fmt.Errorf("%w: its connection closed", errReservationEnded))
	}
	return r
}

func (s *Server) reservation(id string) *reservation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reservations[id]
}

// deliver ends the reservation with a value or an error; only the first
// call counts.
func (r *reservation) deliver(v *payload.Value, err error) bool {
	first := false
	r.once.Do(func() {
		first = true
		r.s.mu.Lock()
		delete(r.s.reservations, r.id)
		r.s.mu.Unlock()
		r.sess.mu.Lock()
		if r.sess.res != nil {
			delete(r.sess.res, r.id)
		}
		r.sess.mu.Unlock()
		r.mu.Lock()
		r.ended = true
		for _, p := range r.slots { // slots no commit took
			os.Remove(p)
		}
		r.slots = nil
		r.mu.Unlock()
		r.result <- reservationResult{v, err}
	})
	return first
}

// await is the coordinator's compute function: it returns what the client
// commits, or ends when the compute timeout does.
func (r *reservation) await(ctx context.Context) (*payload.Value, error) {
	select {
	case res := <-r.result:
		return res.v, res.err
	case <-ctx.Done():
		if r.deliver(nil, ctx.Err()) {
			return nil, fmt.Errorf("agent: the client did not commit in time: %w", ctx.Err())
		}
		res := <-r.result
		return res.v, res.err
	}
}

// slotMapping is a slot file mapped read-only; close unmaps and removes it.
type slotMapping struct {
	data  []byte
	close func() error
}

func mapSlot(path string) (slotMapping, error) {
	f, err := os.Open(path)
	if err != nil {
		return slotMapping{}, fmt.Errorf("agent: slot: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return slotMapping{}, err
	}
	if fi.Size() == 0 {
		os.Remove(path)
		return slotMapping{data: nil, close: func() error { return nil }}, nil
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return slotMapping{}, fmt.Errorf("agent: mapping slot: %w", err)
	}
	var once sync.Once
	return slotMapping{data: data, close: func() error {
		var err error
		once.Do(func() {
			err = syscall.Munmap(data)
			os.Remove(path)
		})
		return err
	}}, nil
}

func randomID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
