package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/internal/localdir"
	"github.com/embcache/embcache/payload"
)

// session is what one connection holds: its open reservations (with their
// slots), and a share in the pins of each client it called for. When the
// connection closes, end gives its reservations back and drops its shares.
type session struct {
	s *Server

	mu      sync.Mutex
	ended   bool
	clients map[string]struct{}     // the clients this connection called for
	res     map[string]*reservation // open reservations

	// The connection's key slot. Only the connection's own calls use it,
	// one at a time (HTTP/1.1); keyMu keeps end (which a Shutdown may call
	// while a call still runs) from unmapping it under a hash.
	keyMu       sync.RWMutex
	keySlotName string
	keySlot     slotMapping
}

// setKeySlot makes m the connection's key slot, closing the one before;
// false if the connection has ended.
func (se *session) setKeySlot(name string, m slotMapping) bool {
	se.keyMu.Lock()
	defer se.keyMu.Unlock()
	se.mu.Lock()
	ended := se.ended
	se.mu.Unlock()
	if ended {
		return false
	}
	if se.keySlot.close != nil {
		se.keySlot.close()
	}
	se.keySlotName, se.keySlot = name, m
	return true
}

// keySlotBytes is the first length bytes of the key slot name, valid until
// release is called.
func (se *session) keySlotBytes(name, length string) (data []byte, release func(), err error) {
	n, perr := strconv.ParseInt(length, 10, 64)
	se.keyMu.RLock()
	switch {
	case se.keySlotName == "" || name != se.keySlotName:
		err = fmt.Errorf("key slot %q is not this connection's", name)
	case perr != nil || n < 0 || n > int64(len(se.keySlot.data)):
		err = fmt.Errorf("key slot length %q: want 0 to %d", length, len(se.keySlot.data))
	}
	if err != nil {
		se.keyMu.RUnlock()
		return nil, nil, err
	}
	return se.keySlot.data[:n], se.keyMu.RUnlock, nil
}

// closeKeySlot unmaps and removes the key slot.
func (se *session) closeKeySlot() {
	se.keyMu.Lock()
	defer se.keyMu.Unlock()
	if se.keySlot.close != nil {
		se.keySlot.close()
	}
	se.keySlotName, se.keySlot = "", slotMapping{}
}

// clientPins are the pins of one client (one process). They are kept while
// any connection that called for the client is open, so a client may spread
// its calls over a pool of connections and close idle ones; they are
// released when its last connection closes (the process exited or was
// killed).
type clientPins struct {
	conns int                 // open connections that called for the client
	pins  map[string]struct{} // pin names its requests looked up
}

// callsFor records that the connection calls for client; false if the
// connection has ended.
func (se *session) callsFor(client string) bool {
	se.mu.Lock()
	defer se.mu.Unlock()
	if se.ended {
		return false
	}
	if _, ok := se.clients[client]; ok {
		return true
	}
	se.clients[client] = struct{}{}
	se.s.pinsMu.Lock()
	cp := se.s.clients[client]
	if cp == nil {
		cp = &clientPins{pins: map[string]struct{}{}}
		se.s.clients[client] = cp
	}
	cp.conns++
	se.s.pinsMu.Unlock()
	return true
}

// pinned records that client's request pin is about to pin a value; the
// connection must have called callsFor(client).
func (s *Server) pinned(client, pin string) {
	s.pinsMu.Lock()
	if cp := s.clients[client]; cp != nil {
		cp.pins[pin] = struct{}{}
	}
	s.pinsMu.Unlock()
}

// unpinned forgets a pin that was released.
func (s *Server) unpinned(client, pin string) {
	s.pinsMu.Lock()
	if cp := s.clients[client]; cp != nil {
		delete(cp.pins, pin)
	}
	s.pinsMu.Unlock()
}

// end gives back what the connection held: its reservations, and the pins
// of each client whose last connection this was.
func (se *session) end() {
	se.mu.Lock()
	if se.ended {
		se.mu.Unlock()
		return
	}
	se.ended = true
	clients, res := se.clients, se.res
	se.clients, se.res = nil, nil
	se.mu.Unlock()
	se.closeKeySlot()
	var pins []string
	se.s.pinsMu.Lock()
	for c := range clients {
		cp := se.s.clients[c]
		if cp.conns--; cp.conns == 0 {
			delete(se.s.clients, c)
			for p := range cp.pins {
				pins = append(pins, p)
			}
		}
	}
	se.s.pinsMu.Unlock()
	if len(pins)+len(res) > 0 {
		se.s.disconnects.Add(1)
	}
	for _, r := range res {
		if r.deliver(nil, fmt.Errorf("%w: its connection closed", ErrReservationEnded)) {
			se.s.abandons.Add(1)
			se.s.logger.Info("embcache agent: client gone, reservation abandoned", "key", r.ref.String())
		}
	}
	for _, p := range pins {
		se.s.cache.Release(p)
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
		r.deliver(nil, fmt.Errorf("%w: its connection closed", ErrReservationEnded))
	}
	return r
}

// reservation returns the open reservation id, or why there is none: the
// error it ended with (ErrReservationEnded, ErrComputeTimeout), or
// ErrUnknownReservation for one never made (or ended long ago).
func (s *Server) reservation(id string) (*reservation, error) {
	s.mu.Lock()
	r := s.reservations[id]
	s.mu.Unlock()
	if r != nil {
		return r, nil
	}
	if err, ok := s.ended.Get(id); ok {
		return nil, err
	}
	return nil, ErrUnknownReservation
}

// slotFile is the path the client may create as the reservation's slot.
func (r *reservation) slotFile() string { return filepath.Join(r.s.slotDir, r.id) }

// deliver ends the reservation with a value or an error; only the first
// end (deliver or claim) counts.
func (r *reservation) deliver(v *payload.Value, err error) bool {
	if !r.end(err) {
		return false
	}
	r.send(v, err)
	return true
}

// claim ends the reservation for a commit whose value follows by send: no
// timeout, abandon or closed connection can end it after this, and the
// compute waits for the value.
func (r *reservation) claim() bool { return r.end(nil) }

// send hands the compute what ended the reservation; once, after end.
func (r *reservation) send(v *payload.Value, err error) { r.result <- reservationResult{v, err} }

// end ends the reservation with err (nil: claimed by a commit); only the
// first end counts. Its slot files go: a commit has opened the one it reads.
func (r *reservation) end(err error) bool {
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
		slots := r.slots
		r.slots = nil
		r.mu.Unlock()
		for _, p := range slots { // unlinked outside r.mu, which Stats waits on
			os.Remove(p)
		}
		os.Remove(r.slotFile()) // the slot the client may have made
		if err == nil {
			err = errCommitted
		}
		r.s.ended.Add(r.id, err)
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
		err := fmt.Errorf("%w: the agent is stopping", ErrReservationEnded)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w: no commit within the compute timeout (--compute-timeout)", ErrComputeTimeout)
		}
		if r.deliver(nil, err) {
			return nil, err
		}
		res := <-r.result
		return res.v, res.err
	}
}

// slotMapping is a file mapped read-only; close unmaps and removes it.
type slotMapping struct {
	data  []byte
	close func() error
}

// createSlotFile creates path, which must not exist, for the client to
// write: 0600, or 0660 for the store's group (the clients of another
// user), whatever the agent's umask.
func createSlotFile(path string, group int) (*os.File, error) {
	mode := os.FileMode(0o600)
	if group != localdir.NoGroup {
		mode = 0o660
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return f, nil
}

// createKeySlot creates a file of size bytes at path, writable by the
// client (createSlotFile), and maps it read-only for hashing. Its pages
// are populated once here, not faulted in by every key.
func createKeySlot(path string, size int64, group int) (slotMapping, error) {
	f, err := createSlotFile(path, group)
	if err != nil {
		return slotMapping{}, err
	}
	defer f.Close()
	// Allocated now: a sparse file on a full tmpfs would fault (SIGBUS) in
	// the client writing it; this way the call fails (503 no_space).
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		os.Remove(path)
		if errors.Is(err, syscall.ENOSPC) {
			return slotMapping{}, fmt.Errorf("%w: key slot of %d bytes: %w", payload.ErrNoSpace, size, err)
		}
		return slotMapping{}, err
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		os.Remove(path)
		return slotMapping{}, err
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
