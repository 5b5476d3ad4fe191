package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/natstest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Changes on a real server: what the stream stored reaches a waiter, as a
// read would have found it, and nothing else does. A commit JetStream
// refused is not heard (a core subscriber of the key's own subject sees
// it), nor are a reservation and its heartbeats; a commit, a purge and a
// record that does not decode are, in the order they were stored.
func TestChangesAreWhatTheStreamStored(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	key := kvKey(3)
	changes := subscribe(t, f.b, key)
	l := f.acquire(t, 3)
	refused := l.Record()
	refused.State = StateCommitted
	if _, err := f.b.CompareAndSet(ctx, key, l.Revision()+7, refused, time.Minute); !errors.Is(err, ErrLost) {
		t.Fatalf("a write on a wrong revision: %v", err)
	}
	rev, err := commit(ctx, l, 3)
	if err != nil {
		t.Fatal(err)
	}
	// The first change heard is the commit: had the refused write or a
	// computing record been sent, it would have come first.
	got := awaitChange(t, changes)
	if got.Err != nil || !got.Entry.Live || got.Entry.Record.State != StateCommitted || got.Entry.Rev != rev {
		t.Fatalf("first change %+v, want the commit at %d", got, rev)
	}
	if read := f.read(t, key); read.Rev != got.Entry.Rev || read.TTL != got.Entry.TTL || !read.Stamp.Equal(got.Entry.Stamp) {
		t.Fatalf("the change %+v is not what a read finds: %+v", got.Entry, read)
	}
	if err := f.b.Purge(ctx, key, rev); err != nil {
		t.Fatal(err)
	}
	if got := awaitChange(t, changes); got.Err != nil || got.Entry.Live || got.Entry.Rev <= rev {
		t.Fatalf("after the purge: %+v", got)
	}
	if _, err := f.b.KV(key).Put(ctx, key, []byte("not a record")); err != nil {
		t.Fatal(err)
	}
	if got := awaitChange(t, changes); !errors.Is(got.Err, ErrBadRecord) || got.Entry.Rev == 0 {
		t.Fatalf("a record that does not decode: %+v", got)
	}
}

// earlierBucket makes the 2-shard bucket on nc look created by an earlier
// version: its streams do not republish.
func earlierBucket(t *testing.T, nc *nats.Conn) {
	t.Helper()
	ctx := context.Background()
	if _, err := OpenBucket(ctx, nc, BucketConfig{Name: DefaultBucket, MarkerTTL: time.Minute, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		s, err := js.Stream(ctx, "KV_"+ShardName(DefaultBucket, i))
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.RePublish = nil
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
}

// A bucket of an earlier version (two shards, no republishing):
// EnsureRepublish without update reports it and changes nothing; with
// update it configures every shard and keeps the shards' record, and a
// subscription made before the update hears the changes after it. A shard
// that republishes elsewhere is reported and left alone.
func TestEnsureRepublishOnAnEarlierBucket(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := context.Background()
	earlierBucket(t, nc)
	b, err := BindBucket(ctx, nc, BucketConfig{Name: DefaultBucket})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.EnsureRepublish(ctx, false); !errors.Is(err, ErrNoRepublish) {
		t.Fatalf("an earlier bucket, checked: %v", err)
	}
	key := kvKey(0) // shard 1 of 2
	if ShardOf(key, 2) != 1 {
		t.Fatalf("key %s is in shard %d", key, ShardOf(key, 2))
	}
	changes := subscribe(t, b, key)
	if err := b.EnsureRepublish(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := b.EnsureRepublish(ctx, false); err != nil {
		t.Fatalf("after the update: %v", err)
	}
	if again, err := BindBucket(ctx, nc, BucketConfig{Name: DefaultBucket}); err != nil || len(again.Shards()) != 2 {
		t.Fatalf("after the update the bucket binds with %v (%v)", again, err)
	}
	now := time.Now()
	rev, err := b.Create(ctx, key, Record{V: RecordVersion, State: StateComputing, Owner: "o", Nonce: "n", Started: now, Heartbeat: now}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Purge(ctx, key, rev); err != nil {
		t.Fatal(err)
	}
	if got := awaitChange(t, changes); got.Entry.Live || got.Entry.Rev != rev+1 {
		t.Fatalf("after the update: %+v, want the purge at %d", got, rev+1)
	}

	js, _ := jetstream.New(nc)
	s, err := js.Stream(ctx, "KV_"+ShardName(DefaultBucket, 1))
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	foreign := jetstream.RePublish{Source: "$KV." + ShardName(DefaultBucket, 1) + ".>", Destination: "ops.audit.>", HeadersOnly: true}
	cfg.RePublish = &foreign
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.EnsureRepublish(ctx, true); !errors.Is(err, ErrNoRepublish) {
		t.Fatalf("a shard republishing elsewhere: %v", err)
	}
	if info, err := s.Info(ctx); err != nil || info.Config.RePublish == nil || *info.Config.RePublish != foreign {
		t.Fatalf("the operator's republish was changed: %+v (%v)", info.Config.RePublish, err)
	}
}

// A user who may look at the bucket's streams but not update them (a
// tenant's credentials) checks without trying the update, whose refusal
// the server would not answer: EnsureRepublish returns at once.
func TestEnsureRepublishWithoutTheRightToUpdate(t *testing.T) {
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Configure: func(o *server.Options) error {
		o.Users = []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "viewer", Password: "viewer", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.INFO", "$JS.API.STREAM.INFO.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	dial := func(user string) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, user))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	earlierBucket(t, dial("admin"))
	b, err := BindBucket(context.Background(), dial("viewer"), BucketConfig{Name: DefaultBucket})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.EnsureRepublish(ctx, false); !errors.Is(err, ErrNoRepublish) || ctx.Err() != nil {
		t.Fatalf("checked by a viewer: %v (ctx %v)", err, ctx.Err())
	}
}

// subscribe is b.Changes(key) until the test ends.
func subscribe(t *testing.T, b *Bucket, key string) <-chan Change {
	t.Helper()
	changes, done, err := b.Changes(key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(done)
	return changes
}

func awaitChange(t *testing.T, ch <-chan Change) Change {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(20 * time.Second):
		t.Fatal("no change in 20s")
		return Change{}
	}
}

// The server's own expiry marker is stored, so it is heard too: a waiter
// on a dead holder's key learns of the expiry when it happens, not at its
// next poll. (The record's 1s TTL is the server's to run out.)
func TestChangesHearTheExpiry(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	key := kvKey(5)
	changes := subscribe(t, f.b, key)
	now := time.Now()
	rev, err := f.b.Create(ctx, key, Record{V: RecordVersion, State: StateComputing, Owner: "o", Nonce: "n", Started: now, Heartbeat: now}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := awaitChange(t, changes); got.Err != nil || got.Entry.Live || got.Entry.Rev != rev+1 {
		t.Fatalf("after the record's TTL: %+v, want its marker at %d", got, rev+1)
	}
}
