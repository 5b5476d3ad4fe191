package agent

import (
	"encoding/json"

	"github.com/embcache/embcache/coordinator"
)

// KeyRequest asks for the key of an input. Config must carry every field of
// cachekey.PreprocessingConfig: a missing field is an error, never a zero
// that could make two different preprocessings share a key.
type KeyRequest struct {
	Config    json.RawMessage `json:"config"`               // a JSON object, decoded once into the config: numbers stay exact
	Mode      string          `json:"mode"`                 // raw-bytes, decoded-tensor or tokens
	Data      []byte          `json:"data,omitzero"`        // raw bytes or tensor data (base64 in JSON): required, "" for no bytes (nil is absent)
	DType     string          `json:"dtype,omitempty"`      // decoded-tensor
	Shape     []int64         `json:"shape,omitzero"`       // decoded-tensor: required, [] for a scalar (nil is absent)
	Tokens    []uint32        `json:"tokens,omitzero"`      // tokens: required (nil is absent)
	BlockSize int             `json:"block_size,omitempty"` // tokens; 0: cachekey.DefaultTokenBlockSize
}

// KeyRef names a cached value: what lookups take. Model and WeightEpoch
// are the labels of the key's config (model_id, weight_epoch), as the
// key calls answer them: a lookup must name a model, and one of a key
// the agent made must name its config's labels (else 400).
type KeyRef struct {
	Key         string `json:"key"` // 64 hex digits
	Tenant      string `json:"tenant"`
	Model       string `json:"model,omitempty"`
	WeightEpoch uint64 `json:"weight_epoch,omitempty"`
}

// KeyResponse is the key of an input.
type KeyResponse struct {
	KeyRef
	Mode       string   `json:"mode"`
	PrefixKeys []string `json:"prefix_keys,omitempty"` // tokens: the key of every whole block prefix
}

// LookupRequest asks for a value, or the right to compute it.
type LookupRequest struct {
	KeyRef
	Client    string `json:"client"`     // the calling process (pins are per client and request)
	RequestID string `json:"request_id"` // what Release unpins
}

// Status of a lookup, get or commit.
const (
	StatusHit      = "hit"
	StatusReserved = "reserved" // lookup: the caller computes
	StatusMiss     = "miss"     // get: not cached (nothing reserved)
	StatusAccepted = "accepted" // commit: the agent shares the value
)

// CallHeader names one call: a client may send it with any request, and the
// agent copies it into the answer (every answer: errors and 204s too). A
// client that sends a new name per call can tell the answer to its call
// from an answer to another's, which is how it notices a connection that
// another process or thread also writes to (a socket inherited across
// fork()): such an answer is refused, never taken as a value.
const CallHeader = "Embcache-Call"

// ClientHeader names the client a call is made for. A client that sends it
// on every call has its pins kept while any of its connections is open, not
// only those its lookups came on.
const ClientHeader = "Embcache-Client"

// HeartbeatHeader asks for heartbeats while a lookup waits: a client that
// sends it ("1") gets a 102 Processing answer every heartbeatEvery until
// the final answer, so it can bound each silence by a short timeout (a
// hung agent is noticed in seconds) while a lookup waits minutes for
// another process's compute. HTTP/1.1 clients skip 1xx answers.
const HeartbeatHeader = "Embcache-Heartbeat"

// ConfigHeader carries the preprocessing config (a JSON object, as in
// KeyRequest.Config) of a POST /v1/key/bytes call, whose body is the input
// itself.
const ConfigHeader = "Embcache-Config"

// LookupResponse is a hit (Value set) or a reservation. It names what it
// answers (the key as the agent understood it, the client and the request),
// so that a client can check that the answer is the one to its question.
type LookupResponse struct {
	Status      string `json:"status"`
	Path        string `json:"path,omitempty"` // how the agent got it: local-hit, remote-hit, waited, computed, ...
	Value       *Hit   `json:"value,omitempty"`
	Reservation string `json:"reservation,omitempty"` // granted (reserved) or, in a commit's answer, committed
	// SlotFile (reserved) is a path the client may create, write the value
	// into and commit with Slot set to the reservation: a slot without a
	// call of its own (POST /v1/slot). The agent removes it if the
	// reservation ends without a commit.
	SlotFile  string `json:"slot_file,omitempty"`
	KeyRef           // the key looked up or committed
	Client    string `json:"client"`
	RequestID string `json:"request_id"`
}

// Hit says where a value lies in shm. The file holds the value's encoding
// (docs/protocol.md section 2); the tensor data is Length bytes at Offset.
// The file is read-only and stays valid while the request holds its pin.
type Hit struct {
	File     string   `json:"file"`
	Offset   int64    `json:"offset"`
	Length   int64    `json:"length"`
	Kind     string   `json:"kind"`
	DType    string   `json:"dtype"`
	Shape    []int64  `json:"shape"`
	Tokens   []uint32 `json:"tokens,omitempty"`
	Checksum string   `json:"checksum"` // BLAKE3 of the encoding, verified by the agent
}

// KeySlotRequest asks for a connection's key slot: a file the client
// writes key inputs into (POST /v1/key/bytes?slot=...).
type KeySlotRequest struct {
	Size int64 `json:"size"`
}

// SlotRequest asks for a file to write a computed tensor into.
type SlotRequest struct {
	Reservation string `json:"reservation"`
	Size        int64  `json:"size"` // bytes of tensor data
}

// SlotResponse is a file of Size bytes, writable by the caller.
type SlotResponse struct {
	Reservation string `json:"reservation"` // echoed: the reservation the slot belongs to
	Slot        string `json:"slot"`
	File        string `json:"file"`
	Size        int64  `json:"size"`
}

// CommitRequest hands the agent a computed value: in a slot, or as bytes.
type CommitRequest struct {
	Reservation string   `json:"reservation"`
	Client      string   `json:"client"`
	RequestID   string   `json:"request_id"`
	Kind        string   `json:"kind,omitempty"` // tensor (default), tokens, hidden-prefix
	DType       string   `json:"dtype,omitempty"`
	Shape       []int64  `json:"shape,omitzero"` // tensor, hidden-prefix: required, [] for a scalar (nil is absent)
	Tokens      []uint32 `json:"tokens,omitempty"`
	Slot        string   `json:"slot,omitempty"`
	Data        []byte   `json:"data,omitempty"`
}

// AbandonRequest gives a reservation up (the compute failed).
type AbandonRequest struct {
	Reservation string `json:"reservation"`
	Reason      string `json:"reason,omitempty"`
}

// ReleaseRequest ends a request: the RFC's cleanup_request.
type ReleaseRequest struct {
	Client    string `json:"client"`
	RequestID string `json:"request_id"`
}

// ReleaseResponse says how many pins were dropped, and for which request.
type ReleaseResponse struct {
	Released  int    `json:"released"`
	Client    string `json:"client"`
	RequestID string `json:"request_id"`
}

// Stats is what GET /v1/stats answers.
type Stats struct {
	Agent AgentStats        `json:"agent"`
	Cache coordinator.Stats `json:"cache"`
}

// AgentStats counts what the agent did.
type AgentStats struct {
	Connections   int    `json:"connections"`
	Reservations  int    `json:"reservations"` // open now
	Slots         int    `json:"slots"`        // open now
	Lookups       uint64 `json:"lookups"`
	Hits          uint64 `json:"hits"`
	Reserved      uint64 `json:"reserved"`
	Commits       uint64 `json:"commits"`
	FailedCommits uint64 `json:"failed_commits"` // accepted, then unreadable (the slot cut short)
	Abandons      uint64 `json:"abandons"`
	Disconnects   uint64 `json:"disconnect_cleanups"` // connections closed holding pins, reservations or slots
	BadRequests   uint64 `json:"bad_requests"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Error string `json:"error"`
	Code  string `json:"code"` // bad_request, not_found, conflict, unavailable, internal
}

// keyRefOf is ref as answers name it: the key the agent looked up, not the
// bytes the client sent, so that the client's check covers the agent's
// reading of its request too.
func keyRefOf(ref coordinator.Ref) KeyRef {
	return KeyRef{Key: ref.Key.String(), Tenant: ref.Tenant, Model: ref.Model, WeightEpoch: ref.Epoch}
}
