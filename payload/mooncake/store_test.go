//go:build mooncake && cgo

package mooncake

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/internal/syncbuf"
	"github.com/embcache/embcache/payload"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buildFake compiles testdata/fake_store.c into a shared library.
func buildFake(t *testing.T) string {
	t.Helper()
	lib := filepath.Join(t.TempDir(), "libfake_mooncake.so")
	out, err := exec.Command("gcc", "-Wall", "-Werror", "-shared", "-fPIC", "-o", lib, "testdata/fake_store.c", "-lpthread").CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return lib
}

func openFake(t *testing.T) *Store {
	t.Helper()
	return openFakeLib(t, buildFake(t), Config{})
}

// openFakeLib opens a Store on the fake library lib, with cfg's
// CallTimeout and Logger.
func openFakeLib(t *testing.T, lib string, cfg Config) *Store {
	t.Helper()
	s, err := Open(Config{Library: lib, Node: "n1", LocalHostname: "127.0.0.1", MetadataServer: "P2PHANDSHAKE",
		Protocol: "tcp", MasterServerAddr: "127.0.0.1:50051", GlobalSegmentSize: 64 << 20, LocalBufferSize: 16 << 20,
		CallTimeout: cfg.CallTimeout, Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func value(n int) *payload.Value {
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i*11 + 5)
	}
	return payload.NewTensor(cachekey.Uint8, []int64{int64(n)}, data)
}

var obj = payload.ObjectID{Tenant: "acme", Key: cachekey.Key{7, 7, 7}}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := openFake(t)
	v := value(100_000)
	loc, err := s.Put(ctx, obj, v)
	if err != nil {
		t.Fatal(err)
	}
	if loc.Transport != payload.TransportMooncake || loc.Node != "n1" || loc.Size != v.Size() || loc.Validate() != nil {
		t.Fatalf("location %+v", loc)
	}
	again, err := s.Put(ctx, obj, v)
	if err != nil || again != loc {
		t.Fatalf("duplicate put: %+v %v", again, err)
	}
	for range 3 { // buffers are reused after Close
		got, err := s.Get(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
			t.Fatal("value differs")
		}
		got.Close()
	}
	if n := len(s.owned); n != 1 {
		t.Fatalf("%d registered buffers for three sequential gets, want 1", n)
	}
	if err := s.Delete(ctx, loc, payload.Generation{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := s.Delete(ctx, loc, payload.Generation{}); err != nil {
		t.Fatalf("deleting an absent object: %v", err)
	}
}

func TestErrorCodesMap(t *testing.T) {
	ctx := context.Background()
	lib := buildFake(t)
	// A store of its own for each code: -900 and -901 (the master did not
	// answer) make a store fail every call at once until it answers.
	var s *Store
	var loc payload.Location
	for _, tc := range []struct {
		fail string
		call func() error
		want error
		code int64
	}{
		{"get_into:-704", func() error { _, err := s.Get(ctx, loc); return err }, payload.ErrNotFound, -704},
		{"get_into:-900", func() error { _, err := s.Get(ctx, loc); return err }, payload.ErrUnavailable, -900},
		{"get_into:-901", func() error { _, err := s.Get(ctx, loc); return err }, payload.ErrUnavailable, -901},
		{"get_into:-707", func() error { _, err := s.Get(ctx, loc); return err }, payload.ErrUnavailable, -707},
		{"get_into:-800", func() error { _, err := s.Get(ctx, loc); return err }, payload.ErrUnavailable, -800},
		{"put:-900", func() error {
			_, err := s.Put(ctx, payload.ObjectID{Tenant: "acme", Key: cachekey.Key{9}}, value(10))
			return err
		}, payload.ErrUnavailable, -900},
		{"is_exist:-901", func() error {
			_, err := s.Put(ctx, payload.ObjectID{Tenant: "acme", Key: cachekey.Key{10}}, value(10))
			return err
		}, payload.ErrUnavailable, -901},
		{"remove:-706", func() error { return s.Delete(ctx, loc, payload.Generation{}) }, ErrBusy, -706},
		{"remove:-901", func() error { return s.Delete(ctx, loc, payload.Generation{}) }, payload.ErrUnavailable, -901},
		{"register:-1", func() error {
			_, err := s.Get(ctx, payload.Location{Transport: "mooncake", Object: obj.String(), Size: 1 << 22})
			return err
		}, nil, -1},
	} {
		t.Run(tc.fail, func(t *testing.T) {
			s = openFakeLib(t, lib, Config{})
			var err error
			if loc, err = s.Put(ctx, obj, value(1000)); err != nil {
				t.Fatal(err)
			}
			t.Setenv("FAKE_MOONCAKE_FAIL", tc.fail)
			err = tc.call()
			var ce *CodeError
			if !errors.As(err, &ce) || ce.Code != tc.code {
				t.Fatalf("got %v, want a CodeError with code %d", err, tc.code)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("%v does not map to %v", err, tc.want)
			}
			if down := tc.code == -900 || tc.code == -901; errors.Is(err, ErrMasterUnreachable) != down ||
				(down && !strings.Contains(err.Error(), "master 127.0.0.1:50051 unreachable")) {
				t.Fatalf("%v: ErrMasterUnreachable %v, want %v, naming the master", err, errors.Is(err, ErrMasterUnreachable), down)
			}
			// Only a master that does not answer says nothing of the
			// object (its readers keep its record); a failed transfer
			// (-800: the holder gone) is the object's.
			if down := tc.code == -900 || tc.code == -901; errors.Is(err, payload.ErrStoreUnreachable) != down {
				t.Fatalf("%v: payload.ErrStoreUnreachable %v, want %v", err, errors.Is(err, payload.ErrStoreUnreachable), down)
			}
		})
	}
}

func TestCorruptAndLostObjects(t *testing.T) {
	ctx := context.Background()
	s := openFake(t)
	loc, _ := s.Put(ctx, obj, value(5000))
	t.Setenv("FAKE_MOONCAKE_CORRUPT", "1")
	if got, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrCorrupt) || got != nil {
		t.Fatalf("corrupted bytes: %v", err)
	}
	t.Setenv("FAKE_MOONCAKE_CORRUPT", "0")
	short := loc
	short.Size += 64
	if _, err := s.Get(ctx, short); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("size mismatch: %v", err)
	}
	t.Setenv("FAKE_MOONCAKE_LOST", "1")
	if _, err := s.Put(ctx, payload.ObjectID{Tenant: "acme", Key: cachekey.Key{8}}, value(10)); !errors.Is(err, payload.ErrUnavailable) {
		t.Fatalf("a put that stored nothing was published: %v", err)
	}
}

func TestConcurrentUse(t *testing.T) {
	ctx := context.Background()
	s := openFake(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			o := payload.ObjectID{Tenant: "acme", Key: cachekey.Key{byte(i % 3)}}
			v := value(4096 + i%3)
			for range 20 {
				loc, err := s.Put(ctx, o, v)
				if err != nil {
					t.Error(err)
					return
				}
				got, err := s.Get(ctx, loc)
				if err != nil || !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
					t.Error("get:", err)
					return
				}
				got.Close()
			}
		})
	}
	wg.Wait()
	s.Close()
	if _, err := s.Get(ctx, payload.Location{Transport: "mooncake", Object: obj.String(), Size: 100}); !errors.Is(err, payload.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestLibraryErrors(t *testing.T) {
	if _, err := Open(Config{Library: filepath.Join(t.TempDir(), "missing.so")}); !errors.Is(err, ErrLibrary) {
		t.Fatalf("missing library: %v", err)
	}
	partial := filepath.Join(t.TempDir(), "partial.c")
	os.WriteFile(partial, []byte("void *mooncake_store_create(void) { return 0; }\n"), 0o644)
	lib := filepath.Join(t.TempDir(), "libpartial.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", lib, partial).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	if _, err := Open(Config{Library: lib}); !errors.Is(err, ErrLibrary) {
		t.Fatalf("library without the API: %v", err)
	}
	t.Setenv("FAKE_MOONCAKE_FAIL", "setup:-900")
	_, err := Open(Config{Library: buildFake(t), Protocol: "tcp", MasterServerAddr: "x:1"})
	var ce *CodeError
	if !errors.As(err, &ce) || ce.Op != "setup" || !errors.Is(err, payload.ErrUnavailable) {
		t.Fatalf("failed setup: %v", err)
	}
}

// TestPutReplacesOtherBytes: Mooncake keeps the first put of a name; a Put
// of other bytes (the key's value after an invalidation) removes the old
// object first, and a Delete of the old Location leaves the new one.
func TestPutReplacesOtherBytes(t *testing.T) {
	ctx := context.Background()
	s := openFake(t)
	oldV, newV := value(1000), value(1000)
	newV.Tensor.Data[0] ^= 1
	oldLoc, err := s.Put(ctx, obj, oldV)
	if err != nil {
		t.Fatal(err)
	}
	newLoc, err := s.Put(ctx, obj, newV)
	if err != nil || newLoc.Checksum == oldLoc.Checksum {
		t.Fatalf("%+v %v", newLoc, err)
	}
	if err := s.Delete(ctx, oldLoc, payload.Generation{}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, newLoc)
	if err != nil {
		t.Fatalf("the new value: %v", err)
	}
	defer got.Close()
	if !bytes.Equal(got.Tensor.Data, newV.Tensor.Data) {
		t.Fatal("wrong bytes")
	}
}

// TestMasterUnreachableFailsFast: a call the library does not return from
// within CallTimeout (a master that is down: the real library retries its
// RPC for seconds) fails then, naming the master, and so does every call
// after it, at once and without calling the library, until a probe of the
// master is answered; then calls go through again. An RPC failure (-900)
// does the same. The log says when the master stopped answering and when
// it answered again; Close waits for the call left running (goleak).
func TestMasterUnreachableFailsFast(t *testing.T) {
	ctx := context.Background()
	var log syncbuf.Buffer
	// A call refused at once takes well under timeout, even on a busy
	// machine under the race detector; one the library holds takes it.
	const timeout, fast = time.Second, 500 * time.Millisecond
	s := openFakeLib(t, buildFake(t), Config{CallTimeout: timeout, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	loc, err := s.Put(ctx, obj, value(1000))
	if err != nil {
		t.Fatal(err)
	}
	get := func() (time.Duration, error) {
		start := time.Now()
		v, err := s.Get(ctx, loc)
		if err == nil {
			v.Close()
		}
		return time.Since(start), err
	}
	recovered := func() {
		t.Helper()
		os.Setenv("FAKE_MOONCAKE_FAIL", "")
		os.Setenv("FAKE_MOONCAKE_SLOW", "")
		for deadline := time.Now().Add(10 * time.Second); ; {
			took, err := get()
			if err == nil {
				return
			}
			if !errors.Is(err, ErrMasterUnreachable) || took > fast || time.Now().After(deadline) {
				t.Fatalf("the master answers again: %v in %v, want fast ErrMasterUnreachable, then the value", err, took)
			}
		}
	}
	// The probe (is_exist) fails until the test says otherwise.
	t.Setenv("FAKE_MOONCAKE_FAIL", "is_exist:-900")
	t.Setenv("FAKE_MOONCAKE_SLOW", "get_into:2500")
	took, err := get()
	if !errors.Is(err, ErrMasterUnreachable) || !errors.Is(err, payload.ErrUnavailable) || took < timeout || took > 2*time.Second ||
		!strings.Contains(err.Error(), "master 127.0.0.1:50051 unreachable: get_into did not return within 1s") {
		t.Fatalf("a get that hangs: %v after %v; want ErrMasterUnreachable after %v", err, took, timeout)
	}
	for range 3 {
		took, err = get()
		if !errors.Is(err, ErrMasterUnreachable) || !errors.Is(err, payload.ErrUnavailable) || took > fast ||
			!strings.Contains(err.Error(), "failing at once until it answers") {
			t.Fatalf("a get while the master is unreachable: %v after %v; want ErrMasterUnreachable at once", err, took)
		}
	}
	start := time.Now()
	if _, err := s.Put(ctx, payload.ObjectID{Tenant: "acme", Key: cachekey.Key{11}}, value(10)); !errors.Is(err, ErrMasterUnreachable) ||
		time.Since(start) > fast {
		t.Fatalf("a put while the master is unreachable: %v after %v", err, time.Since(start))
	}
	recovered()

	t.Setenv("FAKE_MOONCAKE_FAIL", "get_into:-900,is_exist:-900")
	var ce *CodeError
	if _, err := get(); !errors.Is(err, ErrMasterUnreachable) || !errors.As(err, &ce) || ce.Code != -900 {
		t.Fatalf("an RPC failure: %v", err)
	}
	if took, err := get(); !errors.Is(err, ErrMasterUnreachable) || took > fast {
		t.Fatalf("after an RPC failure: %v after %v, want ErrMasterUnreachable at once", err, took)
	}
	recovered()
	for _, want := range []string{"master unreachable, calls fail at once until it answers", "master answers again"} {
		if n := strings.Count(log.String(), want); n != 2 {
			t.Fatalf("the log says %q %d times, want 2:\n%s", want, n, log.String())
		}
	}
	s.Close() // waits for the get left running
}

// TestOpenWithoutMaster: with its master down, the real setup retries for
// about 90 s, then returns -1. When nothing answers at the master's
// address, Open waits CallTimeout more for setup, then fails naming the
// master, and setup finishes on its own; a setup that returns is not
// held back by the dial.
func TestOpenWithoutMaster(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	lib := buildFake(t)
	cfg := Config{Library: lib, Protocol: "tcp", MasterServerAddr: addr, CallTimeout: 300 * time.Millisecond}
	t.Setenv("FAKE_MOONCAKE_SLOW", "setup:2500")
	start := time.Now()
	_, err = Open(cfg)
	took := time.Since(start)
	if !errors.Is(err, ErrMasterUnreachable) || !errors.Is(err, payload.ErrUnavailable) || took > 2*time.Second ||
		!strings.Contains(err.Error(), "master "+addr+" unreachable: setup did not return within") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Open without a master: %v after %v, want ErrMasterUnreachable naming it within about %v", err, took, cfg.CallTimeout)
	}
	abandonedSetups.Wait() // the setup left running, and the store it destroys
	os.Setenv("FAKE_MOONCAKE_SLOW", "")
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("a setup that returns at once: %v", err)
	}
	s.Close()
}
