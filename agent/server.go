package agent

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/internal/dirlock"
	"github.com/embcache/embcache/internal/localdir"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sys/unix"
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
	// errCommitted is what a reservation that was committed ended with: a
	// second commit of it is refused (410, code reservation_ended).
	errCommitted = fmt.Errorf("%w: it was committed", ErrReservationEnded)
)

// Server is a node agent's API. Serve it on a Unix socket.
type Server struct {
	cache      *coordinator.Cache
	store      *shm.Store
	slotDir    string
	group      int      // the store's group (shm.WithGroup): the slots' and the slot directory's, or localdir.NoGroup
	slotLock   *os.File // the slot directory, flock(2)ed while this agent runs
	unlockOnce sync.Once
	maxBody    int64
	logger     *slog.Logger
	http       *http.Server
	sessions   sync.Map // net.Conn -> *session

	mu           sync.Mutex
	reservations map[string]*reservation
	ended        *lru.Cache[string, error] // why recent reservations ended, for their late calls
	// landing: the keys of commits this agent answered whose value is not
	// in its cache yet (being read, stored, committed); each closed once it
	// is, or once the commit failed. A get waits for it: what a client
	// committed, it gets at once.
	landing map[payload.ObjectID]chan struct{}

	pinsMu  sync.Mutex
	clients map[string]*clientPins // by client name

	keyers *lru.Cache[string, *cachekey.Keyer] // by config JSON (POST /v1/key/bytes)
	labels *lru.Cache[cachekey.Key, keyLabels] // of the keys this agent made, by key (refOf)

	stored *lru.Cache[payload.ObjectID, storedFile] // what hit last found in the store

	lookups, hits, reserved, commits, failedCommits, abandons, disconnects, badRequests atomic.Uint64
	background                                                                          sync.WaitGroup // commits being read
	connections                                                                         atomic.Int64
}

// storedFile is a file of the store as hit last saw it.
type storedFile struct {
	v             *payload.Value // the value the file was checked against
	size, modTime int64
	sum           payload.Checksum
}

// Option configures a Server.
type Option func(*Server) error

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(s *Server) error { s.logger = l; return nil }
}

// WithSlotDir sets where slots are created (default: the store's directory
// plus ".slots"). It must be on the same tmpfs as the store to be cheap.
func WithSlotDir(dir string) Option {
	return func(s *Server) error { s.slotDir = dir; return nil }
}

// WithMaxBody bounds request bodies (default 1 GiB): a commit of posted
// bytes or a key of a decoded tensor carries the data.
func WithMaxBody(n int64) Option {
	return func(s *Server) error {
		if n <= 0 {
			return fmt.Errorf("agent: max body %d: must be positive", n)
		}
		s.maxBody = n
		return nil
	}
}

// slotDirMode is the slot directory's when the store has a group
// (shm.WithGroup): the group's members are the clients of another user.
// Set-group-ID: a slot a client makes (0640) belongs to the directory's
// group, which the agent reads it by and whose other members cannot write
// it. The group may create files and open one by its name (random, told
// only to its connection) but not list them (-wx), and, sticky, not
// remove or rename another's: so a client of another user cannot write a
// slot the agent made (0660, a connection's key slot), nor put its own
// file in the place of another client's slot before its commit. Without
// a group it is the owner's only (0700), and so are the slots the agent
// makes (0600): only clients of the agent's own user use them.
const slotDirMode = 0o730 | unix.S_ISGID | unix.S_ISVTX

// New returns the API of cache, whose values are served from store. The
// cache's payload router must have store as its node store
// (payload.WithNodeStore) so that committed values land in it.
//
// The slot directory (WithSlotDir) must be this process's own: another
// user's, a link, or one another user or a group other than the store's
// may write is refused with an error matching shm.ErrUnsafeDir (and
// shm.ErrOtherGroup for the group), and left as it is; another user who
// made it first would read the inputs clients key and the values they
// commit, and change them. It gets the store's group (shm.WithGroup), if
// any, and the mode that goes with it (slotDirMode; 0700 without).
// Another running agent's is ErrSlotDirInUse.
func New(cache *coordinator.Cache, store *shm.Store, opts ...Option) (*Server, error) {
	if cache == nil || store == nil {
		return nil, errors.New("agent: a cache and an shm store are required")
	}
	s := &Server{cache: cache, store: store, slotDir: store.Dir() + ".slots", maxBody: 1 << 30,
		group: store.Group(), logger: slog.Default(), reservations: map[string]*reservation{}, clients: map[string]*clientPins{},
		landing: map[payload.ObjectID]chan struct{}{}}
	s.stored, _ = lru.New[payload.ObjectID, storedFile](1 << 16)
	s.ended, _ = lru.New[string, error](1 << 14)
	s.keyers, _ = lru.New[string, *cachekey.Keyer](256)
	s.labels, _ = lru.New[cachekey.Key, keyLabels](keyLabelsKept)
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	mode := uint32(localdir.Private)
	if s.group != localdir.NoGroup {
		mode = slotDirMode
	}
	if err := localdir.Make(s.slotDir, mode, s.group); err != nil {
		return nil, fmt.Errorf("agent: slot directory: %w", err)
	}
	var err error
	// One agent per slot directory: a second one emptied the first's
	// slots under its clients. The lock goes with the process, even
	// killed; Shutdown releases it.
	if s.slotLock, err = lockDir(s.slotDir); err != nil {
		return nil, err
	}
	// Slots of an agent that was killed: no connection of this one owns them.
	if stale, err := filepath.Glob(filepath.Join(s.slotDir, "*")); err == nil {
		for _, p := range stale {
			os.Remove(p)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/key", s.handleKey)
	mux.HandleFunc("POST /v1/key/bytes", s.handleKeyBytes)
	mux.HandleFunc("POST /v1/key/slot", s.handleKeySlot)
	mux.HandleFunc("POST /v1/lookup", s.handleLookup)
	mux.HandleFunc("POST /v1/get", s.handleGet)
	mux.HandleFunc("POST /v1/slot", s.handleSlot)
	mux.HandleFunc("POST /v1/commit", s.handleCommit)
	mux.HandleFunc("POST /v1/abandon", s.handleAbandon)
	mux.HandleFunc("POST /v1/release", s.handleRelease)
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, _ *http.Request) { reply(w, s.Stats()) })
	mux.Handle("GET /healthz", newHealth(cache))
	s.http = &http.Server{Handler: echoCall(callsFor(mux)), ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			sess := &session{s: s, clients: map[string]struct{}{}, res: map[string]*reservation{}}
			s.sessions.Store(c, sess)
			s.connections.Add(1)
			return context.WithValue(ctx, sessionKey{}, sess)
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				if v, ok := s.sessions.LoadAndDelete(c); ok {
					s.connections.Add(-1)
					v.(*session).end()
				}
			}
		}}
	return s, nil
}

// Serve answers on l until Shutdown. Connections are kept open as long as
// the client keeps them: a connection's end is what releases its pins.
func (s *Server) Serve(l net.Listener) error {
	if err := s.http.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops accepting, waits for calls in progress up to ctx, and ends
// every connection's session.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.http.Shutdown(ctx)
	s.http.Close()
	s.background.Wait()
	s.sessions.Range(func(c, v any) bool {
		s.sessions.Delete(c)
		v.(*session).end()
		return true
	})
	s.unlockOnce.Do(func() { s.slotLock.Close() })
	return err
}

// lockDir takes dir's lock, or fails at once with ErrSlotDirInUse if
// another agent holds it.
func lockDir(dir string) (*os.File, error) {
	f, err := dirlock.Lock(dir)
	if errors.Is(err, dirlock.ErrHeld) {
		return nil, fmt.Errorf("%w: %s (give each agent its own --shm-dir)", ErrSlotDirInUse, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("agent: slot directory: %w", err)
	}
	return f, nil
}

// Stats returns the agent's counters and its cache's.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	open, slots := len(s.reservations), 0
	for _, r := range s.reservations {
		slots += r.slotCount()
	}
	s.mu.Unlock()
	return Stats{Cache: s.cache.Stats(), Agent: AgentStats{
		Connections: int(s.connections.Load()), Reservations: open, Slots: slots,
		Lookups: s.lookups.Load(), Hits: s.hits.Load(), Reserved: s.reserved.Load(), Commits: s.commits.Load(),
		Abandons: s.abandons.Load(), Disconnects: s.disconnects.Load(), BadRequests: s.badRequests.Load(),
		FailedCommits: s.failedCommits.Load()}}
}

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

// ClientHeader names the client a call is made for. A client that sends it
// on every call has its pins kept while any of its connections is open, not
// only those its lookups came on.
const ClientHeader = "Embcache-Client"

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

func (s *Server) handleKey(w http.ResponseWriter, r *http.Request) {
	var req KeyRequest
	if !s.decode(w, r, &req) {
		return
	}
	resp, err := s.key(req)
	if err != nil {
		s.fail(w, fmt.Errorf("%w: %w", ErrBadRequest, err))
		return
	}
	reply(w, resp)
}

// pinName is the coordinator request a client's request pins under.
func pinName(client, requestID string) string { return client + "\x00" + requestID }

func checkRequest(client, requestID string) error {
	if client == "" || requestID == "" {
		return fmt.Errorf("%w: client and request_id are required", ErrBadRequest)
	}
	return nil
}

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

// hit makes sure v lies, verified, in this node's shm store and says
// where. The same value and an unchanged file (one stat) are not checked
// again: hits are the path a Python stage waits on. A file that fails its
// own check is payload.ErrCorrupt.
func (s *Server) hit(ctx context.Context, ref coordinator.Ref, v *payload.Value) (*Hit, error) {
	obj := ref.Object()
	path := s.store.Path(obj)
	seen, known := s.stored.Get(obj)
	if known {
		fi, err := os.Stat(path)
		known = err == nil && seen.v == v && fi.Size() == seen.size && fi.ModTime().UnixNano() == seen.modTime
	}
	sum := seen.sum
	if !known {
		var err error
		if sum, err = s.place(ctx, obj, v); err != nil {
			return nil, err
		}
		if fi, err := os.Stat(path); err == nil {
			s.stored.Add(obj, storedFile{v: v, size: fi.Size(), modTime: fi.ModTime().UnixNano(), sum: sum})
		}
	}
	return &Hit{File: path, Offset: payload.DataOffset(v), Length: int64(len(v.Tensor.Data)),
		Kind: v.Kind.String(), DType: dtypeName(v), Shape: v.Tensor.Shape, Tokens: v.Tokens,
		Checksum: hex.EncodeToString(sum[:])}, nil
}

// place makes sure the node's file of obj holds v's bytes, checked: the
// client maps it without checking it. A file with v's checksum is hashed
// (once per file, by the store); a missing one is written; one that holds
// other bytes, consistent with its own trailer (another value of the key,
// from before or after an invalidation), is replaced by v's. A file whose
// bytes disagree with its own trailer was changed in place: the store
// removes it, and v, which may map it, is not written back
// (payload.ErrCorrupt: the caller drops v).
func (s *Server) place(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Checksum, error) {
	sum, err := payload.Sum(v)
	if err != nil {
		return sum, err
	}
	header, err := payload.Header(v)
	if err != nil {
		return sum, err
	}
	loc := payload.Location{Transport: payload.TransportShm, Node: s.store.Node(), Address: s.store.Dir(),
		Object: obj.String(), Size: int64(len(header) + len(v.Tensor.Data)), Checksum: sum}
	check, err := s.store.Get(ctx, loc)
	switch {
	case err == nil:
		check.Close()
		return sum, nil
	case errors.Is(err, payload.ErrCorrupt):
		if _, serr := os.Stat(s.store.Path(obj)); serr != nil {
			return sum, err // it failed its own check, and is gone
		}
	case !errors.Is(err, payload.ErrNotFound):
		return sum, err
	}
	if _, err := s.store.Put(ctx, obj, v); err != nil {
		return sum, err
	}
	return sum, nil
}

func (s *Server) handleSlot(w http.ResponseWriter, r *http.Request) {
	var req SlotRequest
	if !s.decode(w, r, &req) {
		return
	}
	if req.Size < 0 || req.Size > s.maxBody {
		s.fail(w, fmt.Errorf("%w: slot size %d out of [0, %d]", ErrBadRequest, req.Size, s.maxBody))
		return
	}
	res, err := s.reservation(req.Reservation)
	if err != nil {
		s.fail(w, err)
		return
	}
	name := randomID()
	path := filepath.Join(s.slotDir, name)
	f, err := createSlotFile(path, s.group)
	if err == nil {
		err = f.Truncate(req.Size)
		f.Close()
	}
	if err != nil {
		os.Remove(path)
		s.fail(w, fmt.Errorf("agent: creating slot: %w", err))
		return
	}
	if !res.addSlot(name, path) {
		os.Remove(path)
		_, err := s.reservation(res.id)
		s.fail(w, err)
		return
	}
	reply(w, SlotResponse{Reservation: res.id, Slot: name, File: path, Size: req.Size})
}

func (s *Server) handleAbandon(w http.ResponseWriter, r *http.Request) {
	var req AbandonRequest
	if !s.decode(w, r, &req) {
		return
	}
	res, err := s.reservation(req.Reservation)
	if err != nil {
		s.fail(w, err)
		return
	}
	reason := req.Reason
	if reason == "" {
		reason = "abandoned by the client"
	}
	if !res.deliver(nil, fmt.Errorf("%w: %s", ErrReservationEnded, reason)) {
		_, err := s.reservation(res.id)
		s.fail(w, err)
		return
	}
	s.abandons.Add(1)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request) {
	var req ReleaseRequest
	if !s.decode(w, r, &req) {
		return
	}
	if err := checkRequest(req.Client, req.RequestID); err != nil {
		s.fail(w, err)
		return
	}
	pin := pinName(req.Client, req.RequestID)
	s.unpinned(req.Client, pin)
	reply(w, ReleaseResponse{Released: s.cache.Release(pin), Client: req.Client, RequestID: req.RequestID})
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

// dtypeName is a hit's dtype: none for a tokens value, which has no tensor.
func dtypeName(v *payload.Value) string {
	if v.Kind == payload.KindTokens {
		return ""
	}
	return v.Tensor.DType.String()
}
