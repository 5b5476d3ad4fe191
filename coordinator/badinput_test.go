package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/natstest"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

// validCommitted is a committed record that decodes.
func validCommitted() lease.Record {
	loc := payload.Location{Transport: "shm", Node: "n", Address: "/dev/shm/embcache",
		Object: ref(1).Object().String(), Size: 4160, Checksum: payload.Checksum{9}}
	now := time.Unix(1_800_000_000, 0).UTC()
	return lease.Record{V: lease.RecordVersion, State: lease.StateComputing, Owner: "n/1/ab", Started: now}.Committed(loc, embedding(1), now, time.Hour)
}

// TestBadLeaseRecordsNeverServeWrongValues writes broken records under
// keys, then asks for them: each call returns the right value (computed
// here, without sharing) and counts the bad record; nothing panics.
func TestBadLeaseRecordsNeverServeWrongValues(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	c := newCache(t, srv.ClientURL(), store)
	js, _ := jetstream.New(connect(t, srv.ClientURL()))
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, lease.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	good, _ := json.Marshal(validCommitted())
	bad := map[string][]byte{
		"garbage":         []byte("\x00\xff garbage"),
		"wrong json":      []byte(`{"v":1,"state":`),
		"unknown version": []byte(strings.Replace(string(good), `"v":1`, `"v":9`, 1)),
		"unknown state":   []byte(strings.Replace(string(good), `"committed"`, `"finished"`, 1)),
		"traversal":       []byte(strings.Replace(string(good), `"object":"acme/`, `"object":"../../`, 1)),
	}
	var cnt counter
	i := 40
	for name, b := range bad {
		i++
		r := ref(i)
		if _, err := kv.Put(ctx, r.KVKey(), b); err != nil {
			t.Fatal(err)
		}
		v, path, err := c.GetOrComputePath(ctx, "r", r, cnt.fn(i))
		if err != nil || path != PathDegraded {
			t.Fatalf("%s: %v %v", name, path, err)
		}
		sameValue(t, v, i)
		c.Release("r")
	}
	if n := c.Stats().BadRecords; n != uint64(len(bad)) {
		t.Fatalf("bad records counted %d, want %d", n, len(bad))
	}
}

// TestCorruptOrMissingPayloadIsRecomputed: a committed record whose
// payload is corrupt, has the wrong size, or is gone is a miss, never a
// served value; the key is recomputed and committed again.
func TestCorruptOrMissingPayloadIsRecomputed(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	writer := newCache(t, srv.ClientURL(), store)
	ctx := context.Background()
	js, _ := jetstream.New(connect(t, srv.ClientURL()))
	kv, _ := js.KeyValue(ctx, lease.DefaultBucket)
	var cnt counter
	// A value of another key, committed: its location is genuine, and its
	// bytes verify against it, but they are not the key's value.
	if _, err := writer.GetOrCompute(ctx, "w", ref(98), cnt.fn(98)); err != nil {
		t.Fatal(err)
	}
	writer.Release("w")
	other := *readRecord(t, writer, ref(98)).Record.Location
	for i, tamper := range []func(loc *payload.Location){
		func(loc *payload.Location) { loc.Checksum[0] ^= 1 },                                  // corrupt bytes (as the checksum sees them)
		func(loc *payload.Location) { loc.Size += 64 },                                        // wrong size
		func(loc *payload.Location) { removePayload(t, store, *loc) },                         // payload gone
		func(loc *payload.Location) { loc.Object = ref(99).Object().String(); loc.Size = 64 }, // another object
		func(loc *payload.Location) { *loc = other },                                          // another key's whole, genuine location
	} {
		k := 60 + i
		r := ref(k)
		if _, err := writer.GetOrCompute(ctx, "w", r, cnt.fn(k)); err != nil {
			t.Fatal(err)
		}
		writer.Release("w")
		// Rewrite the committed record with a tampered location.
		cur := readRecord(t, writer, r)
		rec := cur.Record
		loc := *rec.Location
		tamper(&loc)
		rec.Location, rec.Size, rec.Checksum = &loc, loc.Size, loc.Checksum.String()
		data, _ := json.Marshal(rec)
		if _, err := kv.Update(ctx, r.KVKey(), data, cur.Rev); err != nil {
			t.Fatal(err)
		}
		reader := newCache(t, srv.ClientURL(), store)
		v, path, err := reader.GetOrComputePath(ctx, "r", r, cnt.fn(k))
		if err != nil || path != PathComputed {
			t.Fatalf("tamper %d: %v %v", i, path, err)
		}
		sameValue(t, v, k)
		if reader.Stats().PayloadErrors != 1 {
			t.Fatalf("tamper %d: payload errors %d", i, reader.Stats().PayloadErrors)
		}
		genuine, _ := payload.Sum(embedding(k))
		after := readRecord(t, reader, r)
		if !after.Live || after.Record.State != lease.StateCommitted || after.Record.Location.Checksum != genuine {
			t.Fatalf("tamper %d: the key was not committed again with the genuine value", i)
		}
	}
}

// TestKeysWithSubjectCharactersAreRefused: a tenant with '.', '*', '>' or
// a space is refused at every entry point, before it can reach a subject.
func TestKeysWithSubjectCharactersAreRefused(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	c := newCache(t, srv.ClientURL(), store, WithEvents(0))
	ctx := context.Background()
	var cnt counter
	for _, tenant := range []string{"a.b", "*", ">", "a b", "", "acme.>", "x\n"} {
		r := ref(1)
		r.Tenant = tenant
		if _, err := c.GetOrCompute(ctx, "r", r, cnt.fn(1)); !errors.Is(err, cachekey.ErrInvalidConfig) {
			t.Errorf("GetOrCompute(%q): %v", tenant, err)
		}
		if _, err := c.Reserve(ctx, r); !errors.Is(err, cachekey.ErrInvalidConfig) {
			t.Errorf("Reserve(%q): %v", tenant, err)
		}
		if err := c.Invalidate(ctx, tenant, "m", 1); err == nil {
			t.Errorf("Invalidate(%q) accepted", tenant)
		}
		if _, err := payload.ParseObjectID(tenant + "/" + r.Key.String()); !errors.Is(err, payload.ErrInvalidLocation) {
			t.Errorf("ParseObjectID(%q): %v", tenant, err)
		}
	}
	for _, s := range []string{"a.b", "*", ">", " ", strings.Repeat("g", 64), strings.Repeat("A", 64)} {
		if _, err := cachekey.Parse(s); !errors.Is(err, cachekey.ErrMalformedKey) {
			t.Errorf("cachekey.Parse(%q): %v", s, err)
		}
	}
	if cnt.n[1].Load() != 0 {
		t.Fatal("a refused request computed")
	}
}

// TestOversizedAndFullStores: a value over the local budget is refused
// with an error; a payload store that is full leaves the value uncommitted
// but still correct; a KV bucket that is full degrades (or, strict, errors).
func TestOversizedAndFullStores(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	var cnt counter

	small := newCache(t, srv.ClientURL(), payload.NewMemoryStore("test-node", 0),
		WithLocalCache(localcache.Budget{MaxBytes: 1024}))
	if _, err := small.GetOrCompute(ctx, "r", ref(1), cnt.fn(1)); !errors.Is(err, localcache.ErrTooLarge) {
		t.Fatalf("oversized value: %v", err)
	}

	full := payload.NewMemoryStore("test-node", 100) // smaller than any value
	c := newCache(t, srv.ClientURL(), full)
	v, path, err := c.GetOrComputePath(ctx, "r", ref(2), cnt.fn(2))
	if err != nil || path != PathComputed {
		t.Fatalf("full payload store: %v %v", path, err)
	}
	sameValue(t, v, 2)
	if readRecord(t, c, ref(2)).Live {
		t.Fatal("a value whose payload could not be written was committed")
	}

	// A lease bucket that cannot take another record.
	js, _ := jetstream.New(connect(t, srv.ClientURL()))
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "TINY", MaxBytes: 600, Storage: jetstream.FileStorage,
		LimitMarkerTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	degrade := newCache(t, srv.ClientURL(), payload.NewMemoryStore("test-node", 0), WithBucket("TINY"))
	strict := newCache(t, srv.ClientURL(), payload.NewMemoryStore("test-node", 0), WithBucket("TINY"), WithMode(ModeStrict))
	sawDegrade := false
	for k := 10; k < 20; k++ {
		v, path, err := degrade.GetOrComputePath(ctx, "r", ref(k), cnt.fn(k))
		if err != nil {
			t.Fatalf("degrade with a full bucket: %v", err)
		}
		sameValue(t, v, k)
		sawDegrade = sawDegrade || path == PathDegraded
	}
	if !sawDegrade {
		t.Fatal("the bucket never filled")
	}
	if _, err := strict.GetOrCompute(ctx, "r", ref(30), cnt.fn(30)); !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("strict with a full bucket: %v", err)
	}
}

// TestAForeignLocationDeletesNothing: a record of one key (acme's) naming
// another tenant's genuine payload, then removed by an invalidation, does
// not get that payload deleted: the reconciler counts it and announces
// nothing. (It deleted beta's payload, and told its node to, before.)
func TestAForeignLocationDeletesNothing(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	rec, _ := startReconciler(t, srv.ClientURL(), store)
	waitFor(t, func() bool { return rec.Stats().Active })
	ctx := context.Background()
	js, _ := jetstream.New(connect(t, srv.ClientURL()))
	kv, _ := js.KeyValue(ctx, lease.DefaultBucket)
	plain := newCache(t, srv.ClientURL(), store) // no events: the record alone names the payload
	var cnt counter
	other := ref(40)
	other.Tenant, other.Model = "beta", "n"
	a := ref(41)
	for i, r := range []Ref{other, a} {
		if _, err := plain.GetOrCompute(ctx, "w", r, cnt.fn(40+i)); err != nil {
			t.Fatal(err)
		}
		plain.Release("w")
	}
	genuine := *readRecord(t, plain, other).Record.Location
	cur := readRecord(t, plain, a)
	forged := cur.Record
	forged.Location, forged.Size, forged.Checksum = &genuine, genuine.Size, genuine.Checksum.String()
	data, _ := json.Marshal(forged)
	if _, err := kv.Update(ctx, a.KVKey(), data, cur.Rev); err != nil {
		t.Fatal(err)
	}
	if err := eventCache(t, srv.ClientURL(), store).Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return rec.Stats().ForeignLocations == 1 })
	if s := rec.Stats(); s.Invalidated != 1 || s.PayloadDeletes != 0 {
		t.Fatalf("%+v", s)
	}
	if _, err := store.Get(ctx, genuine); err != nil {
		t.Fatalf("beta's payload is gone after acme's invalidation: %v", err)
	}
}

// A store TTL outside 1s..24h is refused by name: a value's last event
// must outlive it in the event stream (events.MaxStoreTTL), or its expiry
// finds nothing to say where its payload is.
func TestStoreTTLOutOfRangeIsRefused(t *testing.T) {
	nc := natstest.Connect(t, natstest.Server(t).ClientURL())
	for _, d := range []time.Duration{0, 500 * time.Millisecond, events.MaxStoreTTL + time.Second, 48 * time.Hour} {
		if _, err := New(context.Background(), nc, WithStoreTTL(d)); !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "store TTL") {
			t.Errorf("store TTL %v: %v, want ErrInvalidOption naming it", d, err)
		}
	}
}
