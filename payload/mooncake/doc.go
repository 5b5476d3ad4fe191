// Package mooncake is the production payload transport: a Transport over
// Mooncake Store's C API (libmooncake_store.so, built from Mooncake with
// -DWITH_STORE_C_SHARED=ON). It needs cgo and the build tag mooncake:
//
//	go build -tags mooncake ./...
//
// The library is opened at run time with dlopen (Config.Library), so a
// binary built with the tag starts on machines without Mooncake and says
// so when the transport is opened. Gets land in buffers registered with
// the store (get_into), so RDMA can write into them directly; a Put is
// published only after is_exist reports the object, since a duplicate put
// returns success without writing.
//
// Mooncake objects have no TTL: the reconciler deletes them when the
// committed record expires.
package mooncake
