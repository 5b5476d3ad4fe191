//go:build mooncake && cgo

package mooncake

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/embcache/embcache/payload"
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

// Store is a payload.Transport over Mooncake Store. Safe for concurrent use.
type Store struct {
	cfg Config
	lib *lib

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
	l, err := loadLib(cfg.Library)
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, lib: l, verified: map[string]verifiedObject{}, stop: make(chan struct{})}
	// With its master down, setup retries for about 90 s and returns -1.
	// It runs on a goroutine of its own while the master's address is
	// dialed: if nothing answers there, Open waits CallTimeout more for
	// setup, then fails naming the master and leaves setup to finish (and
	// the store to be destroyed) on its own.
	start := time.Now()
	setup := make(chan int64, 1)
	go func() { setup <- l.setup(cfg) }()
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
			err := &CodeError{Op: "setup", Code: rc}
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

// release unregisters and frees the buffers, destroys the store and
// unloads the library.
func (s *Store) release() {
	for _, p := range s.owned {
		s.lib.unregisterBuffer(p)
		freeBuffer(p)
	}
	s.owned = nil
	s.lib.close()
}

var _ payload.Transport = (*Store)(nil)
