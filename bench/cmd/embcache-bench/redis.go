package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/redis/go-redis/v9"
)

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

func (r *redisSystem) detail() any { return r.local.Stats() }

func (r *redisSystem) close() {
	r.ps.Close()
	<-r.done
	r.rdb.Close()
	r.srv.Close()
}

// startRedis runs redis-server on a free loopback port, without persistence.
func startRedis(ctx context.Context, dir string) (addr string, pid int, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", 0, nil, err
	}
	port, err := embedded.FreePort("127.0.0.1")
	if err != nil {
		return "", 0, nil, err
	}
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--loglevel", "warning")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			stop()
			return "", 0, nil, fmt.Errorf("redis-server did not answer on %s: %s", addr, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr, cmd.Process.Pid, stop, nil
}
