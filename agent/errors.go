package agent

import (
	"errors"
	"fmt"
)

var (
	// ErrUnknownReservation is answered (404) for a reservation the agent
	// never made, or ended too long ago to remember why (an ended one it
	// remembers is ErrReservationEnded or ErrComputeTimeout).
	ErrUnknownReservation = errors.New("agent: unknown reservation")
	// ErrBadRequest is answered (400) for a body that does not decode or
	// breaks the API's rules.
	ErrBadRequest = errors.New("agent: bad request")
	// ErrReservationEnded is answered (410, code reservation_ended) for a
	// reservation that has ended: abandoned, or its connection closed. The
	// agent's other waiters for the key look it up again.
	ErrReservationEnded = errors.New("agent: the reservation has ended")
	// ErrComputeTimeout is answered (410, code compute_timeout) for a
	// reservation that was not committed within the compute timeout; the
	// key is free for another process to compute.
	ErrComputeTimeout = errors.New("agent: the reservation ran past the compute timeout")
	// ErrSlotDirInUse is returned by New when another running agent holds
	// the slot directory (one agent per --shm-dir): starting would have
	// removed that agent's slots under its clients.
	ErrSlotDirInUse = errors.New("agent: the slot directory is another running agent's")
	// ErrInvalidOption is returned by New for a bad option.
	ErrInvalidOption = errors.New("agent: invalid option")
	// errCommitted is what a reservation that was committed ended with: a
	// second commit of it is refused (410, code reservation_ended).
	errCommitted = fmt.Errorf("%w: it was committed", ErrReservationEnded)
)
