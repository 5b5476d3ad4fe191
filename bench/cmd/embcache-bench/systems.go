package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
	"github.com/redis/go-redis/v9"
)

// The systems the workload suite compares, as one worker process
// runs them. Each answers get(key) with the value, computing it with fn
// when it decides this process must; the caller calls release when done.

type computeFunc = func(ctx context.Context) (*payload.Value, error)

type dedupSystem interface {
	get(ctx context.Context, req string, key cachekey.Key, fn computeFunc) (v *payload.Value, release func(), err error)
	// messages counts network messages this process sent or received so
	// far (NATS messages; Redis commands, replies and pushes; groupcache
	// peer requests and responses).
	messages() uint64
	// detail is what the system itself counted, for the JSON (may be nil).
	detail() any
	close()
}

// Systems, by the name the bench and its JSON use.
const (
	sysNone       = "none"
	sysLocal      = "local"
	sysRedis      = "redis"
	sysGroupcache = "groupcache"
	sysEmbcache   = "embcache-r1"
	sysEmbcacheNS = "embcache-r1-nosync" // SyncAlways off: as durable as the Redis peer (no persistence)
	sysEmbcacheR3 = "embcache-r3"
	sysEmbcacheSh = "embcache-r1-shm"
	sysEmbcacheMC = "embcache-r1-mooncake" // values through a real Mooncake Store (mooncake.go)
)

var allSystems = []string{sysNone, sysLocal, sysRedis, sysGroupcache, sysEmbcache, sysEmbcacheNS, sysEmbcacheR3, sysEmbcacheSh, sysEmbcacheMC}

// dedupConfig is what the bench hands each worker process.
type dedupConfig struct {
	System       string          `json:"system"`
	Proc         int             `json:"proc"`
	Procs        int             `json:"procs"`
	Goroutines   int             `json:"goroutines"`
	Unique       int             `json:"unique"`
	Requests     int             `json:"requests"`
	Zipf         float64         `json:"zipf"`
	Seed         uint64          `json:"seed"`
	EncodeMS     int             `json:"encode_ms"`
	EmbedBytes   int             `json:"embed_bytes"`
	NATS         string          `json:"nats,omitempty"`
	Replicas     int             `json:"replicas,omitempty"`
	Redis        string          `json:"redis,omitempty"`
	PeerAddrs    []string        `json:"peer_addrs,omitempty"` // one loopback address per process (groupcache or httppull)
	ShmDir       string          `json:"shm_dir"`
	LocalMaxByte int64           `json:"local_max_bytes"`
	Shards       int             `json:"shards,omitempty"`   // embcache: lease shards
	Mooncake     *mooncakeConfig `json:"mooncake,omitempty"` // embcache-r1-mooncake: the store
}

// openSystem joins cfg.System. computeOf gives the compute of a key's
// input: groupcache's getter is handed only a key (its owner may be asked
// for a key no request of its own named).
func openSystem(ctx context.Context, cfg dedupConfig, logger *slog.Logger, computeOf func(key string) (computeFunc, bool)) (dedupSystem, error) {
	switch cfg.System {
	case sysNone:
		return noCache{}, nil
	case sysLocal:
		c, err := localcache.New(localcache.Options[cachekey.Key, *payload.Value]{Budget: localcache.Budget{MaxBytes: cfg.LocalMaxByte}})
		if err != nil {
			return nil, err
		}
		return &localOnly{c: c}, nil
	case sysRedis:
		return openRedisSystem(cfg)
	case sysGroupcache:
		return openGroupcache(cfg, computeOf)
	case sysEmbcache, sysEmbcacheNS, sysEmbcacheR3, sysEmbcacheSh, sysEmbcacheMC:
		// No live summaries: they would count in the messages per request.
		o := node.Options{NATSURL: cfg.NATS, Name: fmt.Sprintf("p%d", cfg.Proc), ShmDir: filepath.Join(cfg.ShmDir, fmt.Sprintf("p%d", cfg.Proc)),
			Replicas: cfg.Replicas, LeaseShards: cfg.Shards, LeaseTTL: coordinator.DefaultLeaseTTL, StoreTTL: time.Hour, Logger: logger, SummaryInterval: -1,
			Cache: []coordinator.Option{coordinator.WithLocalCache(localcache.Budget{MaxBytes: cfg.LocalMaxByte})}}
		switch {
		case cfg.System == sysEmbcacheSh: // one node: every process maps the others' files
			o.Name, o.ShmDir = "bench-node", filepath.Join(cfg.ShmDir, "shared")
		case cfg.System == sysEmbcacheMC:
			// Each process contributes a segment (the default, 512 MiB)
			// for the run, as a node's long-lived process does.
			if cfg.Mooncake == nil {
				return nil, fmt.Errorf("%s: no Mooncake store in the config", cfg.System)
			}
			o.Payload = node.PayloadMooncake
			o.Mooncake = node.MooncakeOptions{Library: cfg.Mooncake.Library, MasterServerAddr: cfg.Mooncake.Master,
				MetadataServer: cfg.Mooncake.Metadata, LocalHostname: "127.0.0.1", Protocol: "tcp"}
		default:
			o.PayloadListen = cfg.PeerAddrs[cfg.Proc]
		}
		n, err := node.New(o)
		if err != nil {
			return nil, err
		}
		if err := n.Start(ctx); err != nil {
			return nil, err
		}
		// Ready means sharing: a process that starts while a new R3 bucket
		// is still electing its leader degrades until it reconnects.
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = n.Ready(rctx)
		cancel()
		if err != nil {
			n.Close()
			return nil, err
		}
		return &embcacheSystem{n: n}, nil
	}
	return nil, fmt.Errorf("unknown system %q", cfg.System)
}

// noCache computes every time: the cost the cache exists to remove.
type noCache struct{}

func (noCache) get(ctx context.Context, _ string, _ cachekey.Key, fn computeFunc) (*payload.Value, func(), error) {
	v, err := fn(ctx)
	return v, func() {}, err
}
func (noCache) messages() uint64 { return 0 }
func (noCache) close()           {}
func (noCache) detail() any      { return nil }

// localOnly is each process alone: a local LRU with single-flight.
type localOnly struct {
	c *localcache.Cache[cachekey.Key, *payload.Value]
}

func (l *localOnly) get(ctx context.Context, req string, key cachekey.Key, fn computeFunc) (*payload.Value, func(), error) {
	v, err := l.c.GetOrCompute(ctx, req, key, fn)
	return v, func() { l.c.Release(req) }, err
}
func (l *localOnly) messages() uint64 { return 0 }
func (l *localOnly) close()           {}
func (l *localOnly) detail() any      { return l.c.Stats() }

// embcacheSystem is the real thing, joined as `embcache worker` joins.
type embcacheSystem struct{ n *node.Node }

// benchModel is the encoder the embcache systems name in their keys, as a
// serving stack does: with a model and epoch, a remote hit reads the
// invalidation tombstone too (docs/protocol.md 4.4).
const benchModel = "bench-encoder"

func (e *embcacheSystem) get(ctx context.Context, req string, key cachekey.Key, fn computeFunc) (*payload.Value, func(), error) {
	v, err := e.n.Cache().GetOrCompute(ctx, req, coordinator.Ref{Tenant: "bench", Key: key, Model: benchModel, Epoch: 1}, fn)
	return v, func() { e.n.Cache().Release(req) }, err
}
func (e *embcacheSystem) messages() uint64 {
	s := e.n.Conn().Stats()
	return s.InMsgs + s.OutMsgs
}
func (e *embcacheSystem) delivered() uint64 { return e.n.Conn().Stats().InMsgs }
func (e *embcacheSystem) close()            { e.n.Close() }
func (e *embcacheSystem) detail() any       { return e.n.Cache().Stats() }

var (
	// redisAcquire reads the value and, if there is none, takes the lease,
	// in one step: a GET then a SET NX would let a commit land between the
	// two and the key be computed twice.
	redisAcquire = redis.NewScript(`local v = redis.call("GET", KEYS[1])
if v then return {1, v} end
if redis.call("SET", KEYS[2], ARGV[1], "NX", "PX", ARGV[2]) then return {2, ""} end
return {3, ""}`)
	redisCommit = redis.NewScript(`if redis.call("GET", KEYS[1]) ~= ARGV[1] then return 0 end
redis.call("SET", KEYS[2], ARGV[2], "PX", ARGV[3])
redis.call("DEL", KEYS[1])
redis.call("PUBLISH", KEYS[3], ARGV[2])
return 1`)
	redisAbandon = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)
	redisRenew   = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("PEXPIRE", KEYS[1], ARGV[2]) end return 0`)
)

const redisChannelPrefix = "emb:c:"

// openPullPlane is one process's payload store and httppull server, on the
// address the bench assigned it: the bytes move the way embcache moves them.
func openPullPlane(cfg dedupConfig) (*httppull.Transport, *http.Server, error) {
	node := fmt.Sprintf("p%d", cfg.Proc)
	store, err := shm.Open(filepath.Join(cfg.ShmDir, node), shm.WithNode(node))
	if err != nil {
		return nil, nil, err
	}
	l, err := net.Listen("tcp", cfg.PeerAddrs[cfg.Proc])
	if err != nil {
		return nil, nil, err
	}
	tr, err := httppull.NewTransport(node, "http://"+l.Addr().String(), store)
	if err != nil {
		l.Close()
		return nil, nil, err
	}
	h, err := httppull.NewServer(store)
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	return tr, srv, nil
}
