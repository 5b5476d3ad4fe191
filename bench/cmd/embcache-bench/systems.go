package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
	"github.com/golang/groupcache"
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
			Replicas: cfg.Replicas, LeaseShards: cfg.Shards, LeaseTTL: 5 * time.Second, StoreTTL: time.Hour, Logger: logger, SummaryInterval: -1,
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

// redisSystem is the common Redis pattern, written carefully: a local LRU
// with single-flight in front; on a local miss, one script GETs the value's
// location or, if there is none, SETs NX PX a lease; compute, put the payload on this process's pull
// server, and in one script (fenced by the lease token) SET the location,
// PUBLISH it and DEL the lease. Waiters take the location from a pattern
// subscription shared by the process, and poll (GET, then SET NX to take
// over an expired lease) in case the message is lost.
type redisSystem struct {
	rdb      *redis.Client
	ps       *redis.PubSub
	local    *localcache.Cache[cachekey.Key, *payload.Value]
	tr       *httppull.Transport
	srv      *http.Server
	leaseTTL time.Duration
	poll     time.Duration
	count    atomic.Uint64

	mu      sync.Mutex
	waiters map[string][]chan string // channel -> waiters
	done    chan struct{}
}

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

type redisCounter struct{ n *atomic.Uint64 }

func (h redisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(2); return next(ctx, cmd) }
}
func (h redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(uint64(2 * len(cmds)))
		return next(ctx, cmds)
	}
}

func openRedisSystem(cfg dedupConfig) (*redisSystem, error) {
	local, err := localcache.New(localcache.Options[cachekey.Key, *payload.Value]{Budget: localcache.Budget{MaxBytes: cfg.LocalMaxByte}})
	if err != nil {
		return nil, err
	}
	tr, srv, err := openPullPlane(cfg)
	if err != nil {
		return nil, err
	}
	r := &redisSystem{rdb: redis.NewClient(&redis.Options{Addr: cfg.Redis}), local: local, tr: tr, srv: srv,
		leaseTTL: 5 * time.Second, poll: 100 * time.Millisecond, waiters: map[string][]chan string{}, done: make(chan struct{})}
	r.rdb.AddHook(redisCounter{&r.count})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.ps = r.rdb.PSubscribe(ctx, redisChannelPrefix+"*")
	if _, err := r.ps.Receive(ctx); err != nil { // the subscription is confirmed
		r.ps.Close() // dispatch has not started: nothing to wait for
		r.rdb.Close()
		srv.Close()
		return nil, fmt.Errorf("redis subscribe: %w", err)
	}
	go r.dispatch()
	return r, nil
}

func (r *redisSystem) dispatch() {
	defer close(r.done)
	for m := range r.ps.Channel() {
		r.count.Add(1)
		r.mu.Lock()
		ws := r.waiters[m.Channel]
		delete(r.waiters, m.Channel)
		r.mu.Unlock()
		for _, w := range ws {
			w <- m.Payload // buffered 1
		}
	}
}

func (r *redisSystem) wait(channel string) (<-chan string, func()) {
	ch := make(chan string, 1)
	r.mu.Lock()
	r.waiters[channel] = append(r.waiters[channel], ch)
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		ws := r.waiters[channel]
		for i, w := range ws {
			if w == ch {
				r.waiters[channel] = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(r.waiters[channel]) == 0 {
			delete(r.waiters, channel)
		}
	}
}

func (r *redisSystem) get(ctx context.Context, req string, key cachekey.Key, fn computeFunc) (*payload.Value, func(), error) {
	v, err := r.local.GetOrCompute(ctx, req, key, func(ctx context.Context) (*payload.Value, error) {
		return r.fetchOrCompute(ctx, key, fn)
	})
	return v, func() { r.local.Release(req) }, err
}

func (r *redisSystem) fetchOrCompute(ctx context.Context, key cachekey.Key, fn computeFunc) (*payload.Value, error) {
	k := key.String()
	valKey, leaseKey, channel := "emb:v:"+k, "emb:l:"+k, redisChannelPrefix+k
	for {
		token := randomToken()
		res, err := redisAcquire.Run(ctx, r.rdb, []string{valKey, leaseKey}, token, r.leaseTTL.Milliseconds()).Slice()
		if err != nil {
			return nil, err
		}
		switch res[0].(int64) {
		case 1:
			return r.pull(ctx, []byte(res[1].(string)))
		case 2:
			return r.compute(ctx, key, token, valKey, leaseKey, channel, fn)
		}
		// Someone holds the lease: subscribe first, then read again, so a
		// commit between the two is not missed.
		msg, cancel := r.wait(channel)
		v, ok, err := r.fetch(ctx, valKey)
		if ok || err != nil {
			cancel()
			return v, err
		}
		select {
		case loc := <-msg:
			return r.pull(ctx, []byte(loc))
		case <-time.After(r.poll):
			cancel() // try again; take the lease over if it expired
		case <-ctx.Done():
			cancel()
			return nil, ctx.Err()
		}
	}
}

func (r *redisSystem) fetch(ctx context.Context, valKey string) (*payload.Value, bool, error) {
	b, err := r.rdb.Get(ctx, valKey).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	v, err := r.pull(ctx, b)
	return v, err == nil, err
}

func (r *redisSystem) pull(ctx context.Context, locJSON []byte) (*payload.Value, error) {
	var loc payload.Location
	if err := json.Unmarshal(locJSON, &loc); err != nil {
		return nil, fmt.Errorf("redis: bad location: %w", err)
	}
	return r.tr.Get(ctx, loc)
}

func (r *redisSystem) compute(ctx context.Context, key cachekey.Key, token, valKey, leaseKey, channel string, fn computeFunc) (*payload.Value, error) {
	renewed := make(chan struct{})
	stop := make(chan struct{})
	go func() { // keep the lease while computing
		defer close(renewed)
		t := time.NewTicker(r.leaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				redisRenew.Run(ctx, r.rdb, []string{leaseKey}, token, r.leaseTTL.Milliseconds())
			case <-stop:
				return
			}
		}
	}()
	v, err := fn(ctx)
	close(stop)
	<-renewed
	if err != nil {
		redisAbandon.Run(context.WithoutCancel(ctx), r.rdb, []string{leaseKey}, token)
		return nil, err
	}
	loc, err := r.tr.Put(ctx, payload.ObjectID{Tenant: "bench", Key: key}, v)
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(loc)
	// A lost lease (the script returns 0) leaves the value to its new holder.
	if err := redisCommit.Run(ctx, r.rdb, []string{leaseKey, valKey, channel}, token, b, time.Hour.Milliseconds()).Err(); err != nil {
		return nil, err
	}
	return v, nil
}

func randomToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (r *redisSystem) messages() uint64 { return r.count.Load() }
func (r *redisSystem) detail() any      { return r.local.Stats() }

func (r *redisSystem) close() {
	r.ps.Close()
	<-r.done
	r.rdb.Close()
	r.srv.Close()
}

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

// groupcacheSystem is groupcache as it is meant to run: one HTTP peer per
// process, each key filled (single-flight) by the peer that owns it and
// fetched from it by the others; values are the payload encoding.
type groupcacheSystem struct {
	group *groupcache.Group
	srv   *http.Server
}

func openGroupcache(cfg dedupConfig, computeOf func(key string) (computeFunc, bool)) (*groupcacheSystem, error) {
	self := "http://" + cfg.PeerAddrs[cfg.Proc]
	pool := groupcache.NewHTTPPoolOpts(self, nil) // once per process: groupcache's rule
	peers := make([]string, len(cfg.PeerAddrs))
	for i, a := range cfg.PeerAddrs {
		peers[i] = "http://" + a
	}
	pool.Set(peers...)
	g := &groupcacheSystem{}
	g.group = groupcache.NewGroup("embeddings", max(cfg.LocalMaxByte, 1<<20), groupcache.GetterFunc(
		func(ctx context.Context, key string, dest groupcache.Sink) error {
			fn, ok := computeOf(key)
			if !ok {
				return fmt.Errorf("groupcache: no input for key %s", key)
			}
			v, err := fn(ctx)
			if err != nil {
				return err
			}
			b, err := payload.Encode(v)
			if err != nil {
				return err
			}
			return dest.SetBytes(b)
		}))
	l, err := net.Listen("tcp", cfg.PeerAddrs[cfg.Proc])
	if err != nil {
		return nil, err
	}
	g.srv = &http.Server{Handler: pool, ReadHeaderTimeout: 10 * time.Second}
	go g.srv.Serve(l)
	return g, nil
}

func (g *groupcacheSystem) get(ctx context.Context, _ string, key cachekey.Key, _ computeFunc) (*payload.Value, func(), error) {
	var b []byte
	if err := g.group.Get(ctx, key.String(), groupcache.AllocatingByteSliceSink(&b)); err != nil {
		return nil, nil, err
	}
	v, err := payload.Decode(b)
	return v, func() {}, err
}

func (g *groupcacheSystem) messages() uint64 {
	s := &g.group.Stats
	return uint64(2 * (s.PeerLoads.Get() + s.PeerErrors.Get() + s.ServerRequests.Get()))
}

func (g *groupcacheSystem) close()      { g.srv.Close() }
func (g *groupcacheSystem) detail() any { return &g.group.Stats }
