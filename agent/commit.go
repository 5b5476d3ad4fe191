package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"syscall"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/payload"
)

func (s *Server) handleCommit(w http.ResponseWriter, r *http.Request) {
	var req CommitRequest
	if !s.decode(w, r, &req) {
		return
	}
	if err := checkRequest(req.Client, req.RequestID); err != nil {
		s.fail(w, err)
		return
	}
	res, err := s.reservation(req.Reservation)
	if err != nil {
		s.fail(w, err)
		return
	}
	c, err := s.commitOf(res, req)
	if err != nil {
		s.fail(w, err)
		return
	}
	if !res.claim() {
		c.discard()
		_, err := s.reservation(res.id)
		s.fail(w, err)
		return
	}
	landed := s.land(res.ref)
	s.commits.Add(1)
	// The client has its value (it wrote it): it is answered now, and the
	// value is read from its slot and handed to the coordinator, which
	// checksums, stores and commits it, while the client goes on. A read
	// that fails (the slot cut short after this check) fails the compute:
	// the coordinator gives the key back, and other processes compute it.
	reply(w, LookupResponse{Status: StatusAccepted, Reservation: res.id, KeyRef: keyRefOf(res.ref),
		Client: req.Client, RequestID: req.RequestID})
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		defer landed()
		v, err := c.read()
		if err != nil {
			s.failedCommits.Add(1)
			s.logger.Warn("embcache agent: an accepted commit could not be read; the key is given back",
				"key", res.ref.String(), "err", err)
			// As an abandon: this agent's waiters look the key up again.
			err = fmt.Errorf("%w: its commit could not be read: %v", ErrReservationEnded, err)
		}
		res.send(v, err)
		if err == nil {
			// Until the coordinator has stored and committed it (its
			// flight ends), a get of the key waits. Not after a failed
			// read: the flight ends at once, and the key's next one may
			// be another client's compute.
			s.cache.WaitFlight(context.WithoutCancel(r.Context()), res.ref)
		}
	}()
}

// land records that a commit of ref was answered: gets of ref wait until
// the returned func is called.
func (s *Server) land(ref coordinator.Ref) (landed func()) {
	ch := make(chan struct{})
	obj := ref.Object()
	s.mu.Lock()
	s.landing[obj] = ch
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.landing[obj] == ch {
			delete(s.landing, obj)
		}
		s.mu.Unlock()
		close(ch)
	}
}

// pendingCommit is a checked commit whose value is read after the answer.
type pendingCommit struct {
	kind   payload.Kind
	dtype  cachekey.DType
	shape  []int64
	tokens []uint32
	data   []byte   // posted bytes
	slot   *os.File // or the open slot file, of exactly size bytes when checked
	size   int64
}

// commitOf checks a commit: kind, dtype and shape, and a slot file that
// holds exactly the bytes they call for. The slot is opened now (a regular
// file, never through a link), so the reservation's end, which removes its
// path, does not take it away. Its bytes are read with read(2), never
// mapped: the client can write the file, and a mapping of a file cut short
// faults (SIGBUS) wherever it is read, long after this call.
func (s *Server) commitOf(res *reservation, req CommitRequest) (*pendingCommit, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
	}
	c := &pendingCommit{kind: payload.KindTensor, shape: req.Shape, tokens: req.Tokens, data: req.Data}
	if req.Kind != "" {
		var err error
		if c.kind, err = payload.ParseKind(req.Kind); err != nil {
			return nil, bad("%v", err)
		}
	}
	if req.Slot != "" && len(req.Data) > 0 {
		return nil, bad("give a slot or data, not both")
	}
	if c.kind == payload.KindTokens {
		if req.Slot != "" || len(req.Data) > 0 {
			return nil, bad("a tokens value has no tensor data")
		}
		return c, c.check()
	}
	if c.shape == nil { // absent: never taken for a scalar's, which is []
		return nil, bad("a %v value needs a shape ([] for a scalar)", c.kind)
	}
	var err error
	if c.dtype, err = cachekey.ParseDType(req.DType); err != nil {
		return nil, bad("%v", err)
	}
	n, err := cachekey.ElementBytes(c.dtype, c.shape)
	if err != nil {
		return nil, bad("%v", err)
	}
	c.size = int64(n)
	if req.Slot == "" {
		return c, c.check()
	}
	path, ok := res.takeSlot(req.Slot)
	if !ok && req.Slot == res.id { // the file the lookup's answer named, made by the client
		path, ok = res.slotFile(), true
	}
	if !ok {
		return nil, bad("unknown slot %q for this reservation", req.Slot)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, bad("slot: %v", err)
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
		err = bad("slot: %v", err)
	case !fi.Mode().IsRegular():
		err = bad("slot %s is not a regular file", path)
	case fi.Size() != c.size:
		err = bad("slot holds %d bytes; %v %v needs %d", fi.Size(), c.dtype, c.shape, c.size)
	}
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	c.slot = f
	return c, nil
}

// check validates the value without its slot's bytes.
func (c *pendingCommit) check() error {
	v, err := c.value(c.data)
	if err != nil {
		return err
	}
	v.Close()
	return nil
}

func (c *pendingCommit) value(data []byte) (*payload.Value, error) {
	var v *payload.Value
	switch c.kind {
	case payload.KindTokens:
		v = payload.NewTokens(c.tokens)
	case payload.KindHiddenPrefix:
		v = payload.NewHiddenPrefix(c.tokens, c.dtype, c.shape, data)
	default:
		v = payload.NewTensor(c.dtype, c.shape, data)
	}
	if err := v.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	return v, nil
}

// read returns the value, its bytes read from the slot (which it removes).
func (c *pendingCommit) read() (*payload.Value, error) {
	if c.slot == nil {
		return c.value(c.data)
	}
	defer c.discard()
	data := make([]byte, c.size)
	if _, err := io.ReadFull(c.slot, data); err != nil {
		return nil, fmt.Errorf("agent: reading the slot: %w", err)
	}
	return c.value(data)
}

// discard closes and removes the slot file, if any.
func (c *pendingCommit) discard() {
	if c.slot != nil {
		os.Remove(c.slot.Name())
		c.slot.Close()
		c.slot = nil
	}
}
