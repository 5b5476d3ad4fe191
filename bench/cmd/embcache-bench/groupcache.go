package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
	"github.com/golang/groupcache"
)

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

func (g *groupcacheSystem) close() { g.srv.Close() }

func (g *groupcacheSystem) detail() any { return &g.group.Stats }
