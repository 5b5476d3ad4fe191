package live

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Version is the summary schema this package writes and reads.
const Version = 1

// MaxSize bounds a summary's encoding: a larger message is dropped
// unread (a summary is a few hundred bytes).
const MaxSize = 16 << 10

var (
	// ErrBadSummary is returned by Decode for a body that does not decode,
	// is too large, lacks its identity, or whose node or tenant is not its
	// subject's (publish permissions are per subject).
	ErrBadSummary = errors.New("live: bad summary")
	// ErrVersion is returned by Decode for a summary of another version.
	ErrVersion = errors.New("live: unknown summary version")
	// ErrInvalidOption is returned by NewPublisher and NewAggregator for
	// an option they cannot work with.
	ErrInvalidOption = errors.New("live: invalid option")
)

// Roles a process announces itself as.
const (
	RoleServe  = "serve"  // embcache serve: NATS, the pull server, a reconciler
	RoleWorker = "worker" // embcache worker
	RoleAgent  = "agent"  // embcache agent
	RoleCache  = "cache"  // a library Cache
)

// Summary is what one process announces: who it is and its counters,
// cumulative since Start. The msgpack keys are docs/protocol.md 5.1's.
type Summary struct {
	V       int    `msgpack:"v"`
	Node    string `msgpack:"node"`
	ID      string `msgpack:"id"` // this run of the process: new at each start
	Role    string `msgpack:"role"`
	Tenant  string `msgpack:"tenant,omitempty"` // the one tenant it serves, or "" for its account's every tenant
	PID     int    `msgpack:"pid,omitempty"`
	Version string `msgpack:"version,omitempty"` // the binary's or library's
	Start   int64  `msgpack:"start"`             // when it started, ns since 1970 UTC
	Time    int64  `msgpack:"time"`              // when this summary was taken, ns since 1970 UTC
	Every   int64  `msgpack:"every"`             // its publishing interval, ms
	Seq     uint64 `msgpack:"seq"`               // 1 for its first summary, one more for each taken

	// Requests by the path that answered them (coordinator.Path names).
	Requests map[string]uint64 `msgpack:"req,omitempty"`
	Forwards uint64            `msgpack:"fwd,omitempty"` // encoder forwards run here (fn ran, failed ones included)
	// Pulled and Written are payload bytes by transport: pulled from
	// other processes' values, and committed by this one.
	Pulled  map[string]uint64 `msgpack:"pulled,omitempty"`
	Written map[string]uint64 `msgpack:"written,omitempty"`
	// Held and Pinned are the local cache's bytes now, and those of them
	// pinned by requests in flight (gauges, not counters).
	Held   int64 `msgpack:"held,omitempty"`
	Pinned int64 `msgpack:"pinned,omitempty"`
	// Degraded counts requests computed without the store; Lost leases
	// lost while computing and commits the fencing refused; PayloadErrors
	// committed payloads that could not be read.
	Degraded      uint64 `msgpack:"degraded,omitempty"`
	Lost          uint64 `msgpack:"lost,omitempty"`
	PayloadErrors uint64 `msgpack:"payload_err,omitempty"`
	// StoreDown is true while this process cannot reach the lease bucket.
	StoreDown bool `msgpack:"store_down,omitempty"`
	// Unsent counts this process's earlier summaries that could not be
	// published.
	Unsent uint64 `msgpack:"unsent,omitempty"`
	// Reconciler is set by a process that runs one.
	Reconciler *ReconcilerFigures `msgpack:"rec,omitempty"`
}

// ReconcilerFigures are a reconciler's, in its process's summary.
type ReconcilerFigures struct {
	Active  bool   `msgpack:"active" json:"active"`                       // it is the cluster's active reconciler now
	Elected uint64 `msgpack:"elected,omitempty" json:"elected,omitempty"` // times it became active
	Actions uint64 `msgpack:"actions,omitempty" json:"actions,omitempty"` // touches, expiries, invalidations and payload deletes done
}

// Saved is the requests answered without an encoder forward of their
// own: every request but those whose path is computed or degraded
// (docs/protocol.md 5.1).
func (s *Summary) Saved() uint64 {
	var n uint64
	for path, c := range s.Requests {
		if path != "computed" && path != "degraded" {
			n += c
		}
	}
	return n
}

// Total is every request counted.
func (s *Summary) Total() uint64 {
	var n uint64
	for _, c := range s.Requests {
		n += c
	}
	return n
}

// Encode returns s's msgpack body.
func Encode(s *Summary) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true) // a counter takes the bytes its value needs
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// The intervals a summary may say it is sent at: its readers forget a
// process silent for three, and compute rates over them.
const (
	MinInterval = 100 * time.Millisecond
	MaxInterval = time.Hour
)

// Decode reads a summary received on subject. A body that is too large
// or does not decode, lacks its node, id, role or times, or whose node or
// tenant token is not its subject's, is ErrBadSummary; another version
// ErrVersion. Keys it does not know are ignored (a later release of
// version 1 may add some; a change of meaning comes with a new version).
func Decode(subject string, body []byte) (*Summary, error) {
	if len(body) > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes (at most %d)", ErrBadSummary, len(body), MaxSize)
	}
	// The probe reads the whole body: a map or array that declares more
	// elements than the body holds fails it here, before the full decode
	// would allocate for the declared length.
	var probe struct {
		V int `msgpack:"v"`
	}
	if err := msgpack.Unmarshal(body, &probe); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSummary, err)
	}
	if probe.V != Version {
		return nil, fmt.Errorf("%w: %d (this reader knows %d)", ErrVersion, probe.V, Version)
	}
	s := &Summary{}
	if err := msgpack.Unmarshal(body, s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSummary, err)
	}
	if s.Node == "" || s.ID == "" || s.Role == "" || s.Start <= 0 || s.Time <= 0 {
		return nil, fmt.Errorf("%w: no node, id, role, start or time", ErrBadSummary)
	}
	if s.Every < MinInterval.Milliseconds() || s.Every > MaxInterval.Milliseconds() {
		return nil, fmt.Errorf("%w: interval %d ms, not within [%v, %v]", ErrBadSummary, s.Every, MinInterval, MaxInterval)
	}
	if want := Subject(s.Tenant, s.Node, s.ID); subject != want {
		return nil, fmt.Errorf("%w: subject %s, its body says %s", ErrBadSummary, subject, want)
	}
	return s, nil
}
