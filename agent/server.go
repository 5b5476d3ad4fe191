package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
		return nil, fmt.Errorf("%w: a cache and an shm store are required", ErrInvalidOption)
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
