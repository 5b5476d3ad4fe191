package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestJetStreamDirectGetOnACutOffReplica measures what a client on a
// replica cut off from the others (its routes down, its own client port
// up) reads of a key written since, by the two reads the lease bucket
// has: a direct get (kv.Get, what tenant mode's Direct bucket reads with)
// and a get from the stream leader ($JS.API.STREAM.MSG.GET, the default).
// It fails if a get from the leader answers with an old revision, or if
// no direct get answered with the old one (docs/jetstream-notes.md (d)).
func TestJetStreamDirectGetOnACutOffReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time measurement on a 3-node cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := &links{isolate: true}
	cl, err := embedded.StartCluster(ctx, 3, t.TempDir(), l.configure)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	defer cl.Shutdown()
	if l.err != nil {
		t.Fatal(l.err)
	}
	if err := cl.WaitJetStream(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := cl.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	var kv jetstream.KeyValue
	if err := retry(ctx, func() (err error) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "DIRECTGET", Replicas: 3})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := retry(ctx, func() error { _, err := kv.Put(ctx, "k", []byte("v1")); return err }); err != nil {
		t.Fatal(err)
	}
	leader, err := cl.StreamLeader(ctx, js, "KV_DIRECTGET")
	if err != nil {
		t.Fatal(err)
	}
	cut := -1
	for i, n := range cl.Nodes {
		if n != leader {
			cut = i
			break
		}
	}
	// A client of the cut-off node alone, and one of the leader's.
	cnc, err := cl.Nodes[cut].Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer cnc.Close()
	cjs, _ := jetstream.New(cnc)
	ckv, err := cjs.KeyValue(ctx, "DIRECTGET")
	if err != nil {
		t.Fatal(err)
	}
	lnc, err := leader.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer lnc.Close()
	ljs, _ := jetstream.New(lnc)
	lkv, err := ljs.KeyValue(ctx, "DIRECTGET")
	if err != nil {
		t.Fatal(err)
	}
	// Its replica has the first write before the cut.
	if err := retry(ctx, func() error {
		e, err := ckv.Get(ctx, "k")
		if err != nil || string(e.Value()) != "v1" {
			return errors.New("not yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	l.setCut(cut, true)
	var rev2 uint64
	if err := retry(ctx, func() (err error) {
		rev2, err = lkv.Put(ctx, "k", []byte("v2"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	var stale, direct, leaderReads, leaderStale int
	var lastStale time.Duration
	var timeline []string
	for time.Since(cutAt) < 6*time.Second {
		rctx, rcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		at := time.Since(cutAt).Round(10 * time.Millisecond)
		e, err := ckv.Get(rctx, "k")
		if err == nil {
			timeline = append(timeline, fmt.Sprintf("%v: rev %d", at, e.Revision()))
		} else {
			timeline = append(timeline, fmt.Sprintf("%v: %v", at, err))
		}
		if err == nil {
			direct++
			if e.Revision() < rev2 {
				stale++
				lastStale = time.Since(cutAt)
			}
		}
		if seq, err := leaderGet(rctx, cnc, "KV_DIRECTGET", "$KV.DIRECTGET.k"); err == nil {
			leaderReads++
			if seq < rev2 {
				leaderStale++
			}
		}
		rcancel()
		time.Sleep(100 * time.Millisecond)
	}
	l.setCut(cut, false)
	t.Logf("direct gets on the cut-off replica (rev %d is the write after the cut): %s", rev2, strings.Join(timeline, "; "))
	t.Logf("cut-off replica over 6 s: %d direct gets answered, %d of them stale (the last %v after the write); %d leader gets answered, %d stale",
		direct, stale, lastStale.Round(time.Millisecond), leaderReads, leaderStale)
	if stale == 0 {
		t.Errorf("no direct get on the cut-off replica answered with the old revision: the server changed, or the cut healed; docs/jetstream-notes.md (d) and the tenant-mode rule of docs/protocol.md 4.4 rest on it")
	}
	if leaderStale != 0 {
		t.Errorf("a get from the stream leader answered with an old revision on the cut-off node: the default read's premise is wrong")
	}
}

// leaderGet is the sequence of subject's last message in stream, as its
// leader answers $JS.API.STREAM.MSG.GET (lease.Bucket.Read's request).
func leaderGet(ctx context.Context, nc *nats.Conn, stream, subject string) (uint64, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": subject})
	resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return 0, err
	}
	var body struct {
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &body); err != nil {
		return 0, err
	}
	if body.Error != nil {
		return 0, body.Error
	}
	if body.Message == nil {
		return 0, errors.New("no message")
	}
	return body.Message.Seq, nil
}
