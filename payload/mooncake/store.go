//go:build mooncake && cgo

package mooncake

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Prototypes of Mooncake Store's C API (mooncake-store/include/store_c.h),
// declared here so the build needs no Mooncake headers.
typedef void *mc_store_t;
typedef struct {
	size_t replica_num;
	int with_soft_pin;
	int with_hard_pin;
	const char **preferred_segments;
	size_t preferred_segments_count;
} mc_replicate_config_t;

typedef mc_store_t (*mc_create_fn)(void);
typedef void (*mc_destroy_fn)(mc_store_t);
typedef int (*mc_setup_fn)(mc_store_t, const char *, const char *, uint64_t, uint64_t, const char *, const char *, const char *);
typedef int (*mc_put_fn)(mc_store_t, const char *, const void *, size_t, const mc_replicate_config_t *);
typedef int64_t (*mc_get_into_fn)(mc_store_t, const char *, void *, size_t);
typedef int64_t (*mc_get_size_fn)(mc_store_t, const char *);
typedef int (*mc_is_exist_fn)(mc_store_t, const char *);
typedef int (*mc_remove_fn)(mc_store_t, const char *, int);
typedef int (*mc_register_fn)(mc_store_t, void *, size_t);
typedef int (*mc_unregister_fn)(mc_store_t, void *);

typedef struct {
	void *lib;
	mc_create_fn create;
	mc_destroy_fn destroy;
	mc_setup_fn setup;
	mc_put_fn put;
	mc_get_into_fn get_into;
	mc_get_size_fn get_size;
	mc_is_exist_fn is_exist;
	mc_remove_fn remove;
	mc_register_fn register_buffer;
	mc_unregister_fn unregister_buffer;
} mc_api;

// mc_load fills api from the library at path; it returns NULL or the name
// of what failed (the dlerror text stays valid until the next dl call).
static const char *mc_load(const char *path, mc_api *api) {
	memset(api, 0, sizeof *api);
	api->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!api->lib) return dlerror();
#define MC_SYM(field, name) \
	if (!(*(void **)(&api->field) = dlsym(api->lib, name))) return name;
	MC_SYM(create, "mooncake_store_create")
	MC_SYM(destroy, "mooncake_store_destroy")
	MC_SYM(setup, "mooncake_store_setup")
	MC_SYM(put, "mooncake_store_put")
	MC_SYM(get_into, "mooncake_store_get_into")
	MC_SYM(get_size, "mooncake_store_get_size")
	MC_SYM(is_exist, "mooncake_store_is_exist")
	MC_SYM(remove, "mooncake_store_remove")
	MC_SYM(register_buffer, "mooncake_store_register_buffer")
	MC_SYM(unregister_buffer, "mooncake_store_unregister_buffer")
#undef MC_SYM
	return NULL;
}

static void mc_close(mc_api *api) { if (api->lib) dlclose(api->lib); }
static mc_store_t mc_create(mc_api *a) { return a->create(); }
static void mc_destroy(mc_api *a, mc_store_t s) { a->destroy(s); }
static int mc_setup(mc_api *a, mc_store_t s, const char *host, const char *meta, uint64_t seg, uint64_t buf,
                    const char *proto, const char *dev, const char *master) {
	return a->setup(s, host, meta, seg, buf, proto, dev, master);
}
static int mc_put(mc_api *a, mc_store_t s, const char *key, const void *v, size_t n, size_t replicas) {
	mc_replicate_config_t cfg = {0};
	cfg.replica_num = replicas;
	return a->put(s, key, v, n, &cfg);
}
static int64_t mc_get_into(mc_api *a, mc_store_t s, const char *key, void *buf, size_t n) { return a->get_into(s, key, buf, n); }
static int64_t mc_get_size(mc_api *a, mc_store_t s, const char *key) { return a->get_size(s, key); }
static int mc_is_exist(mc_api *a, mc_store_t s, const char *key) { return a->is_exist(s, key); }
static int mc_remove(mc_api *a, mc_store_t s, const char *key, int force) { return a->remove(s, key, force); }
static int mc_register(mc_api *a, mc_store_t s, void *buf, size_t n) { return a->register_buffer(s, buf, n); }
static int mc_unregister(mc_api *a, mc_store_t s, void *buf) { return a->unregister_buffer(s, buf); }
static void *mc_alloc(size_t n) { void *p = NULL; return posix_memalign(&p, 4096, n) == 0 ? p : NULL; }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/embcache/embcache/payload"
	"github.com/zeebo/blake3"
)

// Config says how to reach a Mooncake Store; the fields are setup's arguments.
type Config struct {
	Library           string // dlopen path; default "libmooncake_store.so"
	Node              string // this node, as written in Locations
	LocalHostname     string
	MetadataServer    string // e.g. "P2PHANDSHAKE" or an http:// metadata URL
	GlobalSegmentSize uint64
	LocalBufferSize   uint64
	Protocol          string // "tcp" or "rdma"
	DeviceName        string // RDMA devices; "" lets Mooncake choose
	MasterServerAddr  string // e.g. "127.0.0.1:50051"
	Replicas          int    // replicas per object; default 1
	MaxSize           int64  // largest value accepted; default 4 GiB
	// CallTimeout bounds how long a call waits for the store, plus a
	// second per 100 MiB it moves; default 2 s. A call that has not
	// returned by then fails with ErrMasterUnreachable (the library's own
	// RPC retries to a master that is down take seconds, a black-holed
	// one's much longer) and finishes on its own.
	CallTimeout time.Duration
	// Logger says when the master stops answering and when it answers
	// again; default slog.Default().
	Logger *slog.Logger
}

// probeEvery is how often a Store whose master does not answer asks it
// again (is_exist of probeKey, no object read).
const (
	probeEvery = 500 * time.Millisecond
	probeKey   = "embcache/probe"
)

// Store is a payload.Transport over Mooncake Store. Safe for concurrent use.
type Store struct {
	cfg   Config
	api   *C.mc_api // C memory: cgo forbids C keeping pointers into Go memory
	store C.mc_store_t

	ops sync.WaitGroup // calls in progress; Close waits for them

	mu       sync.Mutex
	closed   bool
	buffers  [64][]unsafe.Pointer      // registered free buffers by size class; guarded by mu
	owned    []unsafe.Pointer          // every registered buffer, freed on Close; guarded by mu
	verified map[string]verifiedObject // Delete's checks of objects' bytes, by object; guarded by mu
	// outage is set while the master does not answer: calls fail at once
	// and a probe asks the master until it does. Guarded by mu.
	outage  *masterError
	stop    chan struct{}  // closed by Close: ends the probe
	probing sync.WaitGroup // the probe; Close waits for it
}

// Open loads the library and sets the store up. The error wraps
// ErrLibrary when the library or a symbol is missing, is a *CodeError
// from setup, or, when nothing answers at the master's address, wraps
// ErrMasterUnreachable (within about CallTimeout: setup itself retries
// for about 90 s).
func Open(cfg Config) (*Store, error) {
	if cfg.Library == "" {
		cfg.Library = "libmooncake_store.so"
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.MaxSize <= 0 {
		cfg.MaxSize = 4 << 30
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	api := (*C.mc_api)(C.calloc(1, C.sizeof_mc_api))
	path := C.CString(cfg.Library)
	defer C.free(unsafe.Pointer(path))
	if failed := C.mc_load(path, api); failed != nil {
		msg := C.GoString(failed)
		C.mc_close(api)
		C.free(unsafe.Pointer(api))
		return nil, fmt.Errorf("%w: %s: %s", ErrLibrary, cfg.Library, msg)
	}
	s := &Store{cfg: cfg, api: api, verified: map[string]verifiedObject{}, stop: make(chan struct{})}
	s.store = C.mc_create(api)
	if s.store == nil {
		s.release()
		return nil, &CodeError{Op: "create", Code: -1}
	}
	cs := func(v string) *C.char { return C.CString(v) }
	args := []*C.char{cs(cfg.LocalHostname), cs(cfg.MetadataServer), cs(cfg.Protocol), cs(cfg.DeviceName), cs(cfg.MasterServerAddr)}
	// With its master down, setup retries for about 90 s and returns -1.
	// It runs on a goroutine of its own while the master's address is
	// dialed: if nothing answers there, Open waits CallTimeout more for
	// setup, then fails naming the master and leaves setup to finish (and
	// the store to be destroyed) on its own.
	start := time.Now()
	setup := make(chan C.int, 1)
	go func() {
		setup <- C.mc_setup(api, s.store, args[0], args[1], C.uint64_t(cfg.GlobalSegmentSize), C.uint64_t(cfg.LocalBufferSize), args[2], args[3], args[4])
		for _, a := range args {
			C.free(unsafe.Pointer(a))
		}
	}()
	dialed := make(chan error, 1)
	go func() { dialed <- dialMaster(cfg.MasterServerAddr, cfg.CallTimeout) }()
	var unreachable error
	var waited <-chan time.Time
	for {
		select {
		case rc := <-setup:
			if rc == 0 {
				return s, nil
			}
			s.release()
			err := &CodeError{Op: "setup", Code: int64(rc)}
			if unreachable != nil {
				return nil, &masterError{master: cfg.MasterServerAddr, since: start, cause: fmt.Errorf("%s (%w)", err.detail(), unreachable)}
			}
			return nil, err
		case err := <-dialed:
			dialed = nil
			if err != nil {
				unreachable, waited = err, time.After(cfg.CallTimeout)
			}
		case <-waited:
			abandonedSetups.Add(1)
			go func() {
				defer abandonedSetups.Done()
				<-setup
				s.release()
			}()
			return nil, &masterError{master: cfg.MasterServerAddr, since: start,
				cause: fmt.Errorf("setup did not return within %v (%w)", time.Since(start).Round(time.Millisecond), unreachable)}
		}
	}
}

// abandonedSetups are the setups Open gave up waiting for, still running.
var abandonedSetups sync.WaitGroup

// dialMaster reports whether a TCP connection to the master's address
// can be made within timeout (nil for an address that is not host:port).
func dialMaster(addr string, timeout time.Duration) error {
	if _, _, err := net.SplitHostPort(addr); err != nil || strings.Contains(addr, "://") {
		return nil
	}
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	return conn.Close()
}

func objectName(obj payload.ObjectID) string { return "embcache/" + obj.String() }

// Put stores v's encoding under obj. An object present with the same bytes
// is left as it is; one with other bytes (the key's value from before an
// invalidation) is removed first, since Mooncake keeps the first put of a
// name. Either way the Location is returned only after is_exist
// reports the object.
func (s *Store) Put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	if err := obj.Validate(); err != nil {
		return payload.Location{}, err
	}
	if v.Size() > s.cfg.MaxSize {
		return payload.Location{}, fmt.Errorf("%w: %d bytes, limit %d", payload.ErrTooLarge, v.Size(), s.cfg.MaxSize)
	}
	enc, err := payload.Encode(v)
	if err != nil {
		return payload.Location{}, err
	}
	if err := ctx.Err(); err != nil {
		return payload.Location{}, err
	}
	sum := payload.Checksum(blake3.Sum256(enc))
	loc := payload.Location{Transport: payload.TransportMooncake, Node: s.cfg.Node, Address: s.cfg.MasterServerAddr,
		Object: obj.String(), Size: int64(len(enc)), Checksum: sum}
	if same, err := s.holds(ctx, loc); err != nil || same {
		return loc, err
	}
	key := C.CString(objectName(obj))
	// The key is freed by the last call that uses it, which may outlive
	// Put (one left to finish on its own).
	// enc holds no Go pointers, put copies it before returning, and the
	// call's closure keeps it alive until then.
	rc, err := s.call(ctx, "put", int64(len(enc)), func() int64 {
		return int64(C.mc_put(s.api, s.store, key, unsafe.Pointer(unsafe.SliceData(enc)), C.size_t(len(enc)), C.size_t(s.cfg.Replicas)))
	}, func(int64) { C.free(unsafe.Pointer(key)) })
	if err != nil {
		return payload.Location{}, err
	}
	if rc != 0 && rc != codeObjectAlreadyExists {
		C.free(unsafe.Pointer(key))
		return payload.Location{}, s.failed("put", rc)
	}
	exist, err := s.call(ctx, "is_exist", 0, func() int64 { return int64(C.mc_is_exist(s.api, s.store, key)) },
		func(int64) { C.free(unsafe.Pointer(key)) })
	if err != nil {
		return payload.Location{}, err
	}
	C.free(unsafe.Pointer(key))
	if exist != 1 {
		if exist < 0 {
			return payload.Location{}, s.failed("is_exist", exist)
		}
		return payload.Location{}, fmt.Errorf("%w: put of %v returned %d but the object does not exist", payload.ErrUnavailable, obj, rc)
	}
	return loc, nil
}

// exists reports whether the store has loc's object (is_exist: no read,
// no lease).
func (s *Store) exists(loc payload.Location) (bool, error) {
	obj, err := loc.ObjectID()
	if err != nil {
		return false, err
	}
	key := C.CString(objectName(obj))
	free := func(int64) { C.free(unsafe.Pointer(key)) }
	rc, err := s.call(context.Background(), "is_exist", 0, func() int64 { return int64(C.mc_is_exist(s.api, s.store, key)) }, free)
	if err != nil {
		return false, err
	}
	free(rc)
	if rc < 0 {
		return false, s.failed("is_exist", rc)
	}
	return rc == 1, nil
}

// holds reports whether the store has loc's object with loc's bytes. An
// object with other bytes is removed (false, nil); one that cannot be
// removed is the error.
func (s *Store) holds(ctx context.Context, loc payload.Location) (bool, error) {
	v, err := s.Get(ctx, loc)
	switch {
	case err == nil:
		v.Close()
		return true, nil
	case errors.Is(err, payload.ErrNotFound):
		return false, nil
	case errors.Is(err, payload.ErrCorrupt):
		return false, s.remove(loc, true) // another value's bytes: forced (see remove)
	}
	return false, err // unavailable, busy: not a reason to remove anything
}

// Get reads the object at loc into a registered buffer and verifies it;
// Close on the value returns the buffer. Errors: payload.ErrNotFound,
// payload.ErrCorrupt (size or checksum), payload.ErrTooLarge,
// payload.ErrUnavailable, or a *CodeError.
func (s *Store) Get(ctx context.Context, loc payload.Location) (*payload.Value, error) {
	if err := loc.Validate(); err != nil {
		return nil, err
	}
	if loc.Transport != payload.TransportMooncake {
		return nil, fmt.Errorf("%w: transport %q is not mooncake", payload.ErrInvalidLocation, loc.Transport)
	}
	if loc.Size > s.cfg.MaxSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", payload.ErrTooLarge, loc.Size, s.cfg.MaxSize)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	obj, _ := loc.ObjectID()
	if err := s.use(); err != nil { // Close waits: buffer registers with the store
		return nil, err
	}
	defer s.done()
	buf, class, err := s.buffer(ctx, int(loc.Size))
	if err != nil {
		return nil, err
	}
	release := func() error { s.putBuffer(buf, class); return nil }
	key := C.CString(objectName(obj))
	// A get left to finish on its own writes into buf until it returns:
	// buf goes back to the pool then, not before.
	n, err := s.call(ctx, "get_into", loc.Size, func() int64 {
		return int64(C.mc_get_into(s.api, s.store, key, buf, C.size_t(loc.Size)))
	}, func(int64) { C.free(unsafe.Pointer(key)); release() })
	if err != nil {
		return nil, err
	}
	C.free(unsafe.Pointer(key))
	if n < 0 {
		release()
		return nil, s.failed("get_into", n)
	}
	if int64(n) != loc.Size {
		release()
		return nil, fmt.Errorf("%w: read %d bytes, location says %d", payload.ErrCorrupt, n, loc.Size)
	}
	data := unsafe.Slice((*byte)(buf), int(loc.Size))
	v, err := payload.Verify(data, loc.Size, loc.Checksum)
	if err != nil {
		release()
		return nil, err
	}
	return payload.WithRelease(v, release), nil
}

// Generation returns the zero Generation: Mooncake keeps no generations
// of an object, nor removes one conditionally.
func (s *Store) Generation(context.Context, payload.Location) (payload.Generation, error) {
	return payload.Generation{}, nil
}

// verifiedFor is how long Delete trusts its own check of an object's
// bytes: the object is read (leased) once, and removed by a later Delete
// once that lease has lapsed, without reading it again.
const verifiedFor = 2 * time.Minute

// Delete removes the object if it holds loc's bytes, and if no reader
// holds it: Mooncake leases an object to each reader, for about 10 s
// after a get (the master's --default_kv_lease_ttl), and the remove is not
// forced, so none is removed under a reader. Delete checks the bytes with
// a get of its own, which leases the object too: the first Delete of an
// object returns ErrBusy, and one after the lease has lapsed (within
// verifiedFor of the check, without reading it again) removes it, or
// returns ErrBusy again while readers keep reading it. Callers try again
// later (the reconciler a few times, then its sweep). An absent object,
// or one with other bytes, is not an error. seen is ignored: the same
// bytes put again between the caller's look at the key's record and this
// delete, or within verifiedFor of the check another value put in its
// place, are not told apart from the object checked, and are removed
// (docs/protocol.md 2.4).
func (s *Store) Delete(ctx context.Context, loc payload.Location, _ payload.Generation) error {
	if !s.checked(loc) {
		v, err := s.Get(ctx, loc)
		switch {
		case errors.Is(err, payload.ErrNotFound), errors.Is(err, payload.ErrCorrupt):
			return nil // gone, or other bytes now
		case err != nil:
			return err
		}
		v.Close()
		s.mu.Lock()
		s.verified[loc.Object] = verifiedObject{sum: loc.Checksum, at: time.Now()}
		s.mu.Unlock()
	}
	err := s.remove(loc, false)
	if !errors.Is(err, ErrBusy) {
		s.mu.Lock()
		delete(s.verified, loc.Object)
		s.mu.Unlock()
	}
	return err
}

// verifiedObject is Delete's check of an object's bytes.
type verifiedObject struct {
	sum payload.Checksum
	at  time.Time
}

// checked reports whether Delete checked loc's bytes within verifiedFor;
// it forgets older checks.
func (s *Store) checked(loc payload.Location) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for name, v := range s.verified {
		if now.Sub(v.at) > verifiedFor {
			delete(s.verified, name)
		}
	}
	v, ok := s.verified[loc.Object]
	return ok && v.sum == loc.Checksum
}

// remove removes loc's object, whatever it holds. Unforced, a remove is
// refused (ErrBusy, -706) while a reader holds the object's lease. Forced
// (Put replacing other bytes: the key's value from before an
// invalidation, which no reader may be served), it goes at once: a reader
// whose object is removed under it gets an error or bytes that fail its
// checksum, never a value.
func (s *Store) remove(loc payload.Location, force bool) error {
	obj, err := loc.ObjectID()
	if err != nil {
		return err
	}
	f := C.int(0)
	if force {
		f = 1
	}
	key := C.CString(objectName(obj))
	free := func(int64) { C.free(unsafe.Pointer(key)) }
	rc, err := s.call(context.Background(), "remove", 0, func() int64 { return int64(C.mc_remove(s.api, s.store, key, f)) }, free)
	if err != nil {
		return err
	}
	free(rc)
	if rc != 0 && rc != codeObjectNotFound {
		return s.failed("remove", rc)
	}
	return nil
}

// Close unregisters and frees the buffers and destroys the store. Values
// still open must be closed first: their bytes are in those buffers.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	s.mu.Unlock()
	s.probing.Wait()
	s.ops.Wait()
	s.release()
	return nil
}

func (s *Store) release() {
	for _, p := range s.owned {
		if s.store != nil {
			C.mc_unregister(s.api, s.store, p)
		}
		C.free(p)
	}
	s.owned = nil
	if s.store != nil {
		C.mc_destroy(s.api, s.store)
		s.store = nil
	}
	C.mc_close(s.api)
	C.free(unsafe.Pointer(s.api))
}

// buffer returns a registered buffer of at least n bytes.
func (s *Store) buffer(ctx context.Context, n int) (unsafe.Pointer, int, error) {
	class := bits.Len(uint(n - 1))
	s.mu.Lock()
	if free := s.buffers[class]; len(free) > 0 {
		p := free[len(free)-1]
		s.buffers[class] = free[:len(free)-1]
		s.mu.Unlock()
		return p, class, nil
	}
	s.mu.Unlock()
	size := C.size_t(1) << class
	p := C.mc_alloc(size)
	if p == nil {
		return nil, 0, fmt.Errorf("%w: cannot allocate a %d-byte buffer", payload.ErrNoSpace, size)
	}
	if rc := C.mc_register(s.api, s.store, p, size); rc != 0 {
		C.free(p)
		return nil, 0, s.masterCheck(ctx, &CodeError{Op: "register_buffer", Code: int64(rc)})
	}
	s.mu.Lock()
	s.owned = append(s.owned, p)
	s.mu.Unlock()
	return p, class, nil
}

func (s *Store) putBuffer(p unsafe.Pointer, class int) {
	s.mu.Lock()
	s.buffers[class] = append(s.buffers[class], p)
	s.mu.Unlock()
}

// call runs c, a call into the library, unless the master is known not to
// answer, and waits for it until ctx ends or its time is up (CallTimeout,
// plus a second per 100 MiB of size): then the error is ctx's, or
// ErrMasterUnreachable, and c is left to finish on its own goroutine, which
// runs abandon with its return code once it has (the memory the call uses
// is freed there, and Close waits for it). Otherwise call returns c's code
// and abandon does not run: what c used is the caller's to free.
func (s *Store) call(ctx context.Context, op string, size int64, c func() int64, abandon func(int64)) (int64, error) {
	if err := s.use(); err != nil {
		abandon(0)
		return 0, err
	}
	var (
		mu               sync.Mutex
		rc               int64
		finished, gaveUp bool
	)
	ended := make(chan struct{})
	go func() {
		defer s.done()
		r := c()
		mu.Lock()
		rc, finished = r, true
		left := gaveUp
		mu.Unlock()
		close(ended)
		if left {
			abandon(r)
		}
	}()
	limit := s.cfg.CallTimeout + time.Duration(size/(100<<20))*time.Second
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var err error
	select {
	case <-ended:
	case <-ctx.Done():
		err = context.Cause(ctx)
	case <-timer.C:
		err = &timeoutError{op: op, after: limit}
	}
	mu.Lock()
	defer mu.Unlock()
	if finished {
		return rc, nil
	}
	gaveUp = true
	if ctx.Err() == nil {
		err = s.trip(err)
	}
	return 0, err
}

// failed is the error of a call that returned code: a *CodeError, or, if
// the code says the master did not answer, ErrMasterUnreachable with it.
func (s *Store) failed(op string, code int64) error {
	err := &CodeError{Op: op, Code: code}
	if masterDown(code) {
		return s.trip(err)
	}
	return err
}

// masterCheck asks the master whether it answers, after a call failed
// with a code that does not say (register_buffer, which a master that
// went away fails with -600): if it does not, err becomes the outage's,
// which names the master, and the calls after it fail at once.
func (s *Store) masterCheck(ctx context.Context, err error) error {
	key := C.CString(probeKey)
	rc, cerr := s.call(ctx, "is_exist", 0, func() int64 { return int64(C.mc_is_exist(s.api, s.store, key)) },
		func(int64) { C.free(unsafe.Pointer(key)) })
	if cerr != nil {
		return cerr // the outage's (refused, or the call timed out), or ctx's
	}
	C.free(unsafe.Pointer(key))
	if rc < 0 && masterDown(rc) {
		return s.trip(err)
	}
	return err
}

// trip records that the master does not answer (cause says how a call
// found it so) and starts the probe that waits until it does; the error
// returned names the master.
func (s *Store) trip(cause error) error {
	err := &masterError{master: s.cfg.MasterServerAddr, since: time.Now(), cause: cause}
	s.mu.Lock()
	if s.outage != nil || s.closed {
		s.mu.Unlock()
		return err
	}
	s.outage = err
	s.probing.Add(1)
	go s.probe()
	s.mu.Unlock()
	s.cfg.Logger.Warn("mooncake: master unreachable, calls fail at once until it answers",
		"master", s.cfg.MasterServerAddr, "err", err)
	return err
}

// probe asks the master whether it answers (is_exist of probeKey) every
// probeEvery until it does, then lets calls through again. One call at a
// time: each runs to its end, however long the library takes.
func (s *Store) probe() {
	defer s.probing.Done()
	key := C.CString(probeKey)
	defer C.free(unsafe.Pointer(key))
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		s.ops.Add(1) // use would refuse it: the master is down
		s.mu.Unlock()
		rc := C.mc_is_exist(s.api, s.store, key)
		s.done()
		if rc < 0 && masterDown(int64(rc)) {
			continue
		}
		s.mu.Lock()
		down := time.Since(s.outage.since)
		s.outage = nil
		s.mu.Unlock()
		s.cfg.Logger.Warn("mooncake: master answers again", "master", s.cfg.MasterServerAddr,
			"unreachable_for", down.Round(time.Millisecond))
		return
	}
}

// refusedLocked is the error a call fails with now (closed, or the
// master unreachable), or nil; s.mu is held.
func (s *Store) refusedLocked() error {
	if s.closed {
		return fmt.Errorf("mooncake: %w", payload.ErrClosed)
	}
	if s.outage != nil {
		fast := *s.outage
		fast.fast = true
		return &fast
	}
	return nil
}

// use admits a call unless the store is closed or the master is known not
// to answer; done ends it.
func (s *Store) use() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.refusedLocked(); err != nil {
		return err
	}
	s.ops.Add(1)
	return nil
}

func (s *Store) done() { s.ops.Done() }

var _ payload.Transport = (*Store)(nil)
