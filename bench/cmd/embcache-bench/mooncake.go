package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/embcache/embcache/internal/mooncakemaster"
)

// The workload's embcache-r1-mooncake system: embcache R1 whose processes
// write and read values through a real Mooncake Store (TCP transport over
// loopback) instead of pulling them from each other's HTTP servers. The
// bench runs the store's mooncake_master, as it runs redis-server; each
// worker process contributes a segment (the node.MooncakeOptions default,
// 512 MiB) for the whole run, as each one of the other systems serves its
// own values: a process stands for a node here, and the segment is its
// long-lived process's (docs/operations.md, Mooncake).

// defaultMooncakeDir is the Mooncake install the environment names, as
// the tests look for it, or "".
func defaultMooncakeDir() string {
	for _, env := range mooncakemaster.DirEnv {
		if dir := os.Getenv(env); dir != "" {
			return dir
		}
	}
	return ""
}

// mooncakeConfig is how a worker reaches the store.
type mooncakeConfig struct {
	Library  string `json:"library"`
	Master   string `json:"master"`   // host:port of the master's RPC
	Metadata string `json:"metadata"` // its HTTP metadata server's URL
}

// errNoMooncake: the system cannot run in this binary or without a store;
// the row says why instead.
var errNoMooncake = errors.New("no Mooncake")

// mooncakeSkip says why the mooncake system cannot run here, or "".
func mooncakeSkip(dir string) string {
	if !mooncakeBuilt {
		return "not in this binary: make build-bench-mooncake builds bin/embcache-bench-mooncake (cgo, -tags mooncake)"
	}
	if dir == "" {
		return "no Mooncake Store: --mooncake-dir, $EMBCACHE_MOONCAKE_DIR or $MOONCAKE_DIR (make mooncake unpacks one into build/mooncake)"
	}
	return ""
}

// startMooncakeMaster runs dir's mooncake_master on free loopback ports
// (its RPC, HTTP metadata server and metrics), and waits until it answers.
func startMooncakeMaster(dir string) (cfg mooncakeConfig, pid int, stop func(), err error) {
	lib := mooncakemaster.Library(dir)
	if _, err := os.Stat(lib); err != nil {
		return cfg, 0, nil, fmt.Errorf("%w: %w", errNoMooncake, err)
	}
	m, err := mooncakemaster.New(dir)
	if err != nil {
		return cfg, 0, nil, err
	}
	if err := m.Start(); err != nil {
		return cfg, 0, nil, err
	}
	stop = func() { m.Stop(syscall.SIGKILL) }
	return mooncakeConfig{Library: lib, Master: m.Addr, Metadata: m.Metadata}, m.Pid(), stop, nil
}
