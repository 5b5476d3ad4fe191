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
	"fmt"
	"unsafe"
)

// lib is Mooncake Store's C API, loaded with dlopen, and the one store
// made with it. It is the only part of the package that calls C.
type lib struct {
	api   *C.mc_api // C memory: cgo forbids C keeping pointers into Go memory
	store C.mc_store_t
}

// loadLib loads the library at path and makes a store with it (not set
// up yet). The error wraps ErrLibrary when the library or a symbol is
// missing, and is a *CodeError when the store cannot be made.
func loadLib(path string) (*lib, error) {
	l := &lib{api: (*C.mc_api)(C.calloc(1, C.sizeof_mc_api))}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	if failed := C.mc_load(cpath, l.api); failed != nil {
		msg := C.GoString(failed)
		l.close()
		return nil, fmt.Errorf("%w: %s: %s", ErrLibrary, path, msg)
	}
	l.store = C.mc_create(l.api)
	if l.store == nil {
		l.close()
		return nil, &CodeError{Op: "create", Code: -1}
	}
	return l, nil
}

// setup is the store's setup: it connects to the master and the metadata
// server and mounts a segment of segment bytes.
func (l *lib) setup(cfg Config) int64 {
	cs := func(v string) *C.char { return C.CString(v) }
	args := []*C.char{cs(cfg.LocalHostname), cs(cfg.MetadataServer), cs(cfg.Protocol), cs(cfg.DeviceName), cs(cfg.MasterServerAddr)}
	defer func() {
		for _, a := range args {
			C.free(unsafe.Pointer(a))
		}
	}()
	return int64(C.mc_setup(l.api, l.store, args[0], args[1], C.uint64_t(cfg.GlobalSegmentSize),
		C.uint64_t(cfg.LocalBufferSize), args[2], args[3], args[4]))
}

// cKey is an object's name in C memory, for the calls that name it. Its
// last call frees it, which may outlive the Go call that made it (a call
// left to finish on its own).
type cKey struct{ p *C.char }

func newKey(name string) cKey { return cKey{C.CString(name)} }

func (k cKey) free() { C.free(unsafe.Pointer(k.p)) }

// put copies data into the object key (replicas copies); 0 or a code.
// data must hold no Go pointers.
func (l *lib) put(key cKey, data []byte, replicas int) int64 {
	return int64(C.mc_put(l.api, l.store, key.p, unsafe.Pointer(unsafe.SliceData(data)), C.size_t(len(data)), C.size_t(replicas)))
}

// getInto reads the object key into buf (n bytes); the bytes read or a
// code.
func (l *lib) getInto(key cKey, buf unsafe.Pointer, n int64) int64 {
	return int64(C.mc_get_into(l.api, l.store, key.p, buf, C.size_t(n)))
}

// isExist is 1 if the object key exists, 0 if not, or a code.
func (l *lib) isExist(key cKey) int64 { return int64(C.mc_is_exist(l.api, l.store, key.p)) }

// remove removes the object key; forced, even while a reader holds its
// lease. 0 or a code.
func (l *lib) remove(key cKey, force bool) int64 {
	f := C.int(0)
	if force {
		f = 1
	}
	return int64(C.mc_remove(l.api, l.store, key.p, f))
}

// allocBuffer allocates n bytes of C memory, page-aligned, for
// registerBuffer; nil if it cannot.
func allocBuffer(n uint64) unsafe.Pointer { return C.mc_alloc(C.size_t(n)) }

// freeBuffer frees a buffer allocBuffer made.
func freeBuffer(p unsafe.Pointer) { C.free(p) }

// registerBuffer registers n bytes at p with the store, so that gets
// can read into them; 0 or a code.
func (l *lib) registerBuffer(p unsafe.Pointer, n uint64) int64 {
	return int64(C.mc_register(l.api, l.store, p, C.size_t(n)))
}

// unregisterBuffer undoes registerBuffer.
func (l *lib) unregisterBuffer(p unsafe.Pointer) {
	if l.store != nil {
		C.mc_unregister(l.api, l.store, p)
	}
}

// close destroys the store, if one was made, and unloads the library.
func (l *lib) close() {
	if l.store != nil {
		C.mc_destroy(l.api, l.store)
		l.store = nil
	}
	C.mc_close(l.api)
	C.free(unsafe.Pointer(l.api))
}
