package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/payload"
)

// lookupRequest decodes and checks a lookup's or get's body, and records
// its client for the connection; false if it answered an error.
func (s *Server) lookupRequest(w http.ResponseWriter, r *http.Request) (LookupRequest, coordinator.Ref, bool) {
	var req LookupRequest
	if !s.decode(w, r, &req) {
		return req, coordinator.Ref{}, false
	}
	if err := checkRequest(req.Client, req.RequestID); err != nil {
		s.fail(w, err)
		return req, coordinator.Ref{}, false
	}
	ref, err := s.refOf(req.KeyRef)
	if err != nil {
		s.fail(w, fmt.Errorf("%w: %w", ErrBadRequest, err))
		return req, coordinator.Ref{}, false
	}
	if !sessionOf(r).callsFor(req.Client) {
		s.fail(w, fmt.Errorf("%w: its connection closed", ErrReservationEnded))
		return req, coordinator.Ref{}, false
	}
	s.lookups.Add(1)
	return req, ref, true
}

func (s *Server) handleLookup(w http.ResponseWriter, r *http.Request) {
	req, ref, ok := s.lookupRequest(w, r)
	if !ok {
		return
	}
	sess := sessionOf(r)
	resp, err := s.lookup(r.Context(), sess, req.Client, req.RequestID, ref, heartbeat(w, r))
	if err != nil {
		s.fail(w, err)
		return
	}
	resp.KeyRef, resp.Client, resp.RequestID = keyRefOf(ref), req.Client, req.RequestID
	reply(w, resp)
}

// lookup answers a hit, or hands the compute to the client: the agent's
// compute function for the key waits for the client's commit.
func (s *Server) lookup(ctx context.Context, sess *session, client, requestID string, ref coordinator.Ref,
	beat func()) (LookupResponse, error) {
	pin := pinName(client, requestID)
	dropped := false
	for {
		reserved := make(chan *reservation, 1)
		type outcome struct {
			v    *payload.Value
			path coordinator.Path
			err  error
		}
		done := make(chan outcome, 1)
		s.pinned(client, pin)
		go func() {
			v, path, err := s.cache.GetOrComputePath(ctx, pin, ref, func(fctx context.Context) (*payload.Value, error) {
				res := s.newReservation(sess, ref)
				reserved <- res
				return res.await(fctx)
			})
			done <- outcome{v, path, err}
		}()
		o, res := waitFor(done, reserved, beat)
		if res != nil {
			s.reserved.Add(1)
			return LookupResponse{Status: StatusReserved, Reservation: res.id, SlotFile: res.slotFile()}, nil
		}
		if errors.Is(o.err, ErrReservationEnded) {
			continue // another client of this agent gave the key up: try again
		}
		if o.err != nil {
			return LookupResponse{}, o.err
		}
		hit, err := s.hit(ctx, ref, o.v)
		if errors.Is(err, payload.ErrCorrupt) && !dropped {
			// The node's file of the value failed its check (the store
			// removed it). This process's copy may be a mapping of it:
			// drop it and look the key up again, from the record.
			s.cache.Release(pin)
			s.cache.Drop(ref)
			dropped = true
			continue
		}
		if err != nil {
			s.cache.Release(pin)
			return LookupResponse{}, err
		}
		// Again: a release of the request that ran while this lookup
		// waited forgot the name, and the pin taken since must still go
		// when the client does.
		s.pinned(client, pin)
		s.hits.Add(1)
		return LookupResponse{Status: StatusHit, Path: o.path.String(), Value: hit}, nil
	}
}

// waitFor waits for a lookup's outcome or reservation, calling beat (if
// not nil) every heartbeat interval meanwhile.
func waitFor[O any](done <-chan O, reserved <-chan *reservation, beat func()) (O, *reservation) {
	var beats <-chan time.Time
	if beat != nil {
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		beats = t.C
	}
	for {
		select {
		case <-beats:
			beat()
		case res := <-reserved:
			var zero O
			return zero, res
		case o := <-done:
			return o, nil
		}
	}
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	req, ref, ok := s.lookupRequest(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	landing := s.landing[ref.Object()]
	s.mu.Unlock()
	if landing != nil {
		t := time.NewTimer(landingWait)
		select { // a commit this agent answered: milliseconds, unless NATS stalls
		case <-landing:
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
	}
	pin := pinName(req.Client, req.RequestID)
	s.pinned(req.Client, pin)
	resp := LookupResponse{Status: StatusMiss, KeyRef: keyRefOf(ref), Client: req.Client, RequestID: req.RequestID}
	v, path, err := s.cache.Get(r.Context(), pin, ref)
	switch {
	case errors.Is(err, coordinator.ErrNotCached):
	case err != nil:
		s.fail(w, err)
		return
	default:
		hit, err := s.hit(r.Context(), ref, v)
		if err != nil {
			s.cache.Release(pin)
			s.fail(w, err)
			return
		}
		s.pinned(req.Client, pin) // again: see lookup
		s.hits.Add(1)
		resp.Status, resp.Path, resp.Value = StatusHit, path.String(), hit
	}
	reply(w, resp)
}

// landingWait bounds how long a get waits for a commit this agent has
// answered and is still storing (a NATS that stalls holds its commit up
// to the op timeouts): then it answers as any get, well within a client's
// call timeout.
const landingWait = time.Second
