package coordinator

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
)

// mislabelled is ref(i) under other labels than its key's: another model.
func mislabelled(i int) Ref {
	r := ref(i)
	r.Model = "other"
	return r
}

// TestARefWithoutAModelIsRefused: every value belongs to a model, so that
// an invalidation can find it; a Ref without one (or with one no record
// can carry) is refused before anything is read, reserved or computed.
func TestARefWithoutAModelIsRefused(t *testing.T) {
	url, store := memoryCluster(t)
	c := eventCache(t, url, store)
	ctx := context.Background()
	var cnt counter
	for name, model := range map[string]string{"none": "", "too long": strings.Repeat("m", cachekey.MaxStringLen+1),
		"not UTF-8": "caf\xe9"} {
		r := ref(1)
		r.Model = model
		if _, err := c.GetOrCompute(ctx, "r", r, cnt.fn(1)); !errors.Is(err, cachekey.ErrInvalidConfig) || !strings.Contains(err.Error(), "model") {
			t.Errorf("GetOrCompute, model %s: %v", name, err)
		}
		if _, _, err := c.Get(ctx, "r", r); !errors.Is(err, cachekey.ErrInvalidConfig) {
			t.Errorf("Get, model %s: %v", name, err)
		}
		if res, err := c.Reserve(ctx, r); !errors.Is(err, cachekey.ErrInvalidConfig) {
			t.Errorf("Reserve, model %s: %v", name, err)
			if res != nil {
				res.Abandon(ctx, errors.New("test"))
			}
		}
		if err := r.Validate(); !errors.Is(err, cachekey.ErrInvalidConfig) {
			t.Errorf("Validate, model %s: %v", name, err)
		}
		c.Release("r")
	}
	if cnt.n[1].Load() != 0 {
		t.Error("a refused request computed")
	}
	if readRecord(t, c, ref(1)).Live {
		t.Error("a refused request left a record")
	}
}

// TestAnUnlabelledCallerCannotOutliveAnInvalidation is issue 33's case: a
// caller that left the model out made a record no invalidation could
// reach, which every correctly labelled caller was then served, also
// after the invalidation of their model had returned.
func TestAnUnlabelledCallerCannotOutliveAnInvalidation(t *testing.T) {
	url, store := memoryCluster(t)
	a, b, c := eventCache(t, url, store), eventCache(t, url, store), eventCache(t, url, store)
	ctx := context.Background()
	var cnt counter
	unlabelled := ref(1)
	unlabelled.Model = ""
	if _, err := a.GetOrCompute(ctx, "r", unlabelled, cnt.fn(1)); err == nil {
		t.Error("a Ref without a model was served")
	}
	a.Release("r")
	if _, err := b.GetOrCompute(ctx, "r", ref(1), cnt.fn(1)); err != nil { // the old weights' value
		t.Fatal(err)
	}
	b.Release("r")
	if err := b.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	// The new weights give the key other bytes (embedding 9).
	v, path, err := c.GetOrComputePath(ctx, "r", ref(1), cnt.fn(9))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release("r")
	if path != PathComputed {
		t.Errorf("after the invalidation: path %v, want the key computed again", path)
	}
	sameValue(t, v, 9)
}

// TestARecordWithoutAModelIsPurged: a committed record without a model
// (an earlier release's, or one written by hand) is nobody's value: a
// reader purges it and computes the key, with its labels, so that the
// next invalidation reaches the value.
func TestARecordWithoutAModelIsPurged(t *testing.T) {
	url, store := memoryCluster(t)
	a, b, c := eventCache(t, url, store), eventCache(t, url, store), eventCache(t, url, store)
	ctx := context.Background()
	old := ref(1)
	old.Model = ""
	res, err := a.reserve(ctx, a.bucket(), old) // as an earlier release reserved: no validation
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.Commit(ctx, embedding(1)); err != nil {
		t.Fatal(err)
	}
	var cnt counter
	v, path, err := b.GetOrComputePath(ctx, "r", ref(1), cnt.fn(2))
	if err != nil {
		t.Fatal(err)
	}
	if path != PathComputed {
		t.Errorf("a record without a model: path %v, want it purged and the key computed", path)
	}
	sameValue(t, v, 2)
	b.Release("r")
	if rec := readRecord(t, b, ref(1)); !rec.Live || rec.Record.Model != "m" {
		t.Errorf("the key's record: %+v, want a committed record of model m", rec)
	}
	if err := b.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	if v, path, err := c.GetOrComputePath(ctx, "r", ref(1), cnt.fn(9)); err != nil || path != PathComputed {
		t.Errorf("after the invalidation: path %v, %v, want the key computed again", path, err)
	} else {
		sameValue(t, v, 9)
	}
	c.Release("r")
}

// TestAMislabelledCallerNeitherGetsNorDestroysARecord: a record is served
// only to callers of its labels. A caller of other labels (another model
// or epoch) computes its own value without sharing it, in either mode,
// and leaves the record to its readers; its Get misses.
func TestAMislabelledCallerNeitherGetsNorDestroysARecord(t *testing.T) {
	url, store := memoryCluster(t)
	a, c := eventCache(t, url, store), eventCache(t, url, store)
	ctx := context.Background()
	var cnt counter
	if _, err := a.GetOrCompute(ctx, "r", ref(1), cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	a.Release("r")
	before := readRecord(t, a, ref(1))
	otherEpoch := ref(1)
	otherEpoch.Epoch = 2
	for i, mode := range []Mode{ModeDegrade, ModeStrict} {
		for j, r := range []Ref{mislabelled(1), otherEpoch} {
			b := eventCache(t, url, store, WithMode(mode))
			want := 10 + 2*i + j
			if _, _, err := b.Get(ctx, "g", r); !errors.Is(err, ErrNotCached) {
				t.Errorf("%v, %s epoch %d: Get: %v, want a miss", mode, r.Model, r.Epoch, err)
			}
			b.Release("g")
			v, path, err := b.GetOrComputePath(ctx, "r", r, cnt.fn(want))
			if err != nil {
				t.Fatalf("%v, %s epoch %d: %v", mode, r.Model, r.Epoch, err)
			}
			if path != PathDegraded {
				t.Errorf("%v, %s epoch %d: path %v, want its own compute, unshared", mode, r.Model, r.Epoch, path)
			}
			sameValue(t, v, want)
			b.Release("r")
			// Its own copy is its labels', never the record's readers'.
			if v, path, err := b.GetOrComputePath(ctx, "r", ref(1), cnt.fn(99)); err != nil || path != PathRemoteHit {
				t.Errorf("%v: a correct caller in the same process: path %v, %v", mode, path, err)
			} else {
				sameValue(t, v, 1)
			}
			b.Release("r")
			if b.Stats().LabelConflicts == 0 {
				t.Errorf("%v: no label conflict counted: %+v", mode, b.Stats())
			}
		}
	}
	if after := readRecord(t, a, ref(1)); !after.Live || after.Rev != before.Rev {
		t.Errorf("the record changed: revision %d, then %d (live %v)", before.Rev, after.Rev, after.Live)
	}
	v, path, err := c.GetOrComputePath(ctx, "r", ref(1), cnt.fn(99))
	if err != nil || path != PathRemoteHit {
		t.Fatalf("a correct caller after the mislabelled ones: path %v, %v", path, err)
	}
	sameValue(t, v, 1)
	c.Release("r")
	if n := cnt.n[1].Load(); n != 1 {
		t.Errorf("the key's value computed %d times", n)
	}
}

// TestALocalCopyServesOnlyItsLabels: the local cache keys a copy by the
// labels it was made under, so a request of other labels in the same
// process gets neither the copy nor its flight, and an invalidation drops
// exactly the copies of its model and epoch.
func TestALocalCopyServesOnlyItsLabels(t *testing.T) {
	url, store := memoryCluster(t)
	a, b := eventCache(t, url, store), eventCache(t, url, store)
	ctx := context.Background()
	var cnt counter

	// A flight in progress is its labels' alone, here and in another
	// process (which does not wait for a compute of other labels).
	started, finish := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(finish) })
	computed := make(chan error, 1)
	go func() {
		_, err := a.GetOrCompute(ctx, "flight", ref(1), func(context.Context) (*payload.Value, error) {
			close(started)
			<-finish
			return embedding(1), nil
		})
		computed <- err
	}()
	<-started
	for _, c := range []*Cache{a, b} {
		type result struct {
			v    *payload.Value
			path Path
			err  error
		}
		done := make(chan result, 1)
		go func() {
			v, path, err := c.GetOrComputePath(ctx, "other", mislabelled(1), cnt.fn(5))
			done <- result{v, path, err}
		}()
		var got result
		select {
		case got = <-done:
		case <-time.After(10 * time.Second):
			t.Error("a request of other labels waits for the compute of ref's")
			release()
			got = <-done
		}
		if got.err != nil {
			t.Fatal(got.err)
		}
		if got.path != PathDegraded {
			t.Errorf("a request of other labels during the compute: path %v", got.path)
		}
		sameValue(t, got.v, 5)
		c.Release("other")
	}
	release()
	if err := <-computed; err != nil {
		t.Fatal(err)
	}
	a.Release("flight")

	// Each copy is served to its labels alone.
	for _, tc := range []struct {
		r    Ref
		want int
	}{{ref(1), 1}, {mislabelled(1), 5}} {
		v, path, err := a.GetOrComputePath(ctx, "r", tc.r, cnt.fn(99))
		if err != nil || path != PathLocalHit {
			t.Fatalf("model %s: path %v, %v, want its own copy", tc.r.Model, path, err)
		}
		sameValue(t, v, tc.want)
		a.Release("r")
	}
	// An invalidation drops its labels' copies, and only theirs.
	if err := a.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	if a.local.Contains(ref(1).local()) || !a.local.Contains(mislabelled(1).local()) {
		t.Errorf("after invalidating m: copy of m %v, of other %v", a.local.Contains(ref(1).local()), a.local.Contains(mislabelled(1).local()))
	}
	if err := a.Invalidate(ctx, "acme", "other", 1); err != nil {
		t.Fatal(err)
	}
	if a.local.Contains(mislabelled(1).local()) {
		t.Error("after invalidating other: its copy stays")
	}
	if n := cnt.n[99].Load(); n != 0 {
		t.Errorf("a copy was missed %d times", n)
	}
}
