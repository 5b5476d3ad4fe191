package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/payload"
)

// echoCall copies the request's CallHeader into the answer before any
// handler writes it, so that every answer names the call it answers.
func echoCall(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if call := r.Header.Get(CallHeader); call != "" {
			w.Header().Set(CallHeader, call)
		}
		h.ServeHTTP(w, r)
	})
}

// callsFor records the client a call names (ClientHeader) for the call's
// connection.
func callsFor(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if client := r.Header.Get(ClientHeader); client != "" {
			sessionOf(r).callsFor(client)
		}
		h.ServeHTTP(w, r)
	})
}

type sessionKey struct{}

func sessionOf(r *http.Request) *session { return r.Context().Value(sessionKey{}).(*session) }

// decode reads a JSON body into v, bounded by the max body size.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		s.fail(w, fmt.Errorf("%w: %w", ErrBadRequest, err))
		return false
	}
	if err := exactNames(body, v); err != nil {
		s.fail(w, fmt.Errorf("%w: %w", ErrBadRequest, err))
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		s.fail(w, fmt.Errorf("%w: %w", ErrBadRequest, err))
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		s.fail(w, fmt.Errorf("%w: data after the request's JSON object", ErrBadRequest))
		return false
	}
	return true
}

// reply answers v with a Content-Length (clients read exactly that much).
func reply(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b)
}

// fail answers err with its status and code.
func (s *Server) fail(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, "internal"
	switch {
	case errors.Is(err, ErrBadRequest):
		status, code = http.StatusBadRequest, "bad_request"
		s.badRequests.Add(1)
	case errors.Is(err, ErrUnknownReservation):
		status, code = http.StatusNotFound, "not_found"
	case errors.Is(err, ErrComputeTimeout):
		status, code = http.StatusGone, "compute_timeout"
	case errors.Is(err, ErrReservationEnded):
		status, code = http.StatusGone, "reservation_ended"
	case errors.Is(err, coordinator.ErrComputeTimeout):
		status, code = http.StatusGatewayTimeout, "compute_timeout"
	case errors.Is(err, coordinator.ErrLeaseLost):
		status, code = http.StatusConflict, "conflict"
	case errors.Is(err, payload.ErrNoSpace):
		status, code = http.StatusServiceUnavailable, "no_space"
	case errors.Is(err, coordinator.ErrStoreUnavailable), errors.Is(err, coordinator.ErrClosed):
		// A closing agent is, to its client, a store it cannot reach: the
		// client computes without it (its degrade path), as it does when
		// the agent is gone.
		status, code = http.StatusServiceUnavailable, "unavailable"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(Error{Error: err.Error(), Code: code})
}
