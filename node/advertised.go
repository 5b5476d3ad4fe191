package node

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
)

// probeTenant is the tenant of the probe values checkAdvertised writes
// (and removes): one of this package's own.
const probeTenant = "embcache-probe"

// How long checkAdvertised tries to reach the advertised pull server (it
// may start after this node), and how often.
const (
	probeFor   = 30 * time.Second
	probeEvery = 500 * time.Millisecond
)

// checkAdvertised checks, for a node that writes HTTP values into its shm
// store and advertises another process's pull server (Advertise without
// PayloadListen: an agent beside its serve), that the server serves this
// store: it writes a probe value and pulls it from the advertised URL. A
// server that answers "not found" serves another directory: every value
// of this node is then unreadable to the others, which compute it again,
// and nothing else says so. It logs an error then, and a warning if the
// server cannot be reached within probeFor; it never stops the node.
func (n *Node) checkAdvertised(ctx context.Context, tr *httppull.Transport) {
	o := &n.opts
	var key cachekey.Key
	rand.Read(key[:])
	data := make([]byte, 64)
	rand.Read(data)
	obj := payload.ObjectID{Tenant: probeTenant, Key: key}
	loc, err := tr.Put(ctx, obj, payload.NewTensor(cachekey.Uint8, []int64{int64(len(data))}, data))
	if err != nil {
		o.Logger.Warn("embcache: could not write a probe value to check the advertised pull server", "err", err)
		return
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if gen, err := tr.Generation(dctx, loc); err == nil {
			tr.Delete(dctx, loc, gen)
		}
	}()
	deadline := time.Now().Add(probeFor)
	var last error
	for {
		v, err := tr.Get(ctx, loc)
		switch {
		case err == nil:
			v.Close()
			o.Logger.Debug("embcache: the advertised pull server serves this node's shm directory", "advertise", o.Advertise)
			return
		case errors.Is(err, payload.ErrNotFound):
			if _, serr := os.Stat(n.store.Path(obj)); serr != nil {
				return // the probe itself is gone (a sweep): nothing learnt
			}
			o.Logger.Error("embcache: the advertised pull server does not serve this node's shm directory: other nodes cannot read its values, and compute them again; give this process and the node's serve the same --shm-dir",
				"advertise", o.Advertise, "shm_dir", n.store.Dir())
			return
		}
		last = err
		if time.Now().After(deadline) {
			o.Logger.Warn("embcache: the advertised pull server did not answer: other nodes cannot read this node's values until it does",
				"advertise", o.Advertise, "err", last)
			return
		}
		t := time.NewTimer(probeEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
