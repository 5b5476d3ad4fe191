package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/natstest"
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
	changes, done, err := f.b.Changes(key)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
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

// A bucket created without republishing (an earlier version) is made to
// republish by the next OpenBucket; BindBucket, which creates nothing,
// leaves it as it is, and its waiters get ErrNoChanges (they poll).
func TestChangesOnAnEarlierBucket(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: DefaultBucket, History: 1, LimitMarkerTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	bound, err := BindBucket(ctx, nc, BucketConfig{Name: DefaultBucket})
	if err != nil {
		t.Fatal(err)
	}
	if bound.Republished() {
		t.Fatal("an earlier bucket, bound, reports republishing")
	}
	if _, _, err := bound.Changes(kvKey(1)); !errors.Is(err, ErrNoChanges) {
		t.Fatalf("Changes on an earlier bucket: %v", err)
	}
	opened, err := OpenBucket(ctx, nc, BucketConfig{Name: DefaultBucket})
	if err != nil {
		t.Fatal(err)
	}
	if !opened.Republished() {
		t.Fatal("OpenBucket did not make the earlier bucket republish")
	}
	changes, done, err := opened.Changes(kvKey(1))
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	rev, err := opened.Create(ctx, kvKey(1), Record{V: RecordVersion, State: StateComputing, Owner: "o", Nonce: "n",
		Started: time.Now(), Heartbeat: time.Now()}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := opened.Purge(ctx, kvKey(1), rev); err != nil {
		t.Fatal(err)
	}
	if got := awaitChange(t, changes); got.Entry.Live || got.Entry.Rev != rev+1 {
		t.Fatalf("after the update: %+v, want the purge at %d", got, rev+1)
	}
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
	changes, done, err := f.b.Changes(key)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	now := time.Now()
	rev, err := f.b.Create(ctx, key, Record{V: RecordVersion, State: StateComputing, Owner: "o", Nonce: "n", Started: now, Heartbeat: now}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := awaitChange(t, changes); got.Err != nil || got.Entry.Live || got.Entry.Rev != rev+1 {
		t.Fatalf("after the record's TTL: %+v, want its marker at %d", got, rev+1)
	}
}
