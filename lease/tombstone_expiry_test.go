package lease

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestATombstoneRewrittenAsTheOldOneExpiresSurvives: an invalidation of
// labels whose old tombstone is expiring (25 h on; here 1 s) must not write
// on its revision: the server's expiry marker for it carries no condition
// (docs/jetstream-notes.md (a)), and rolls up a write accepted between the
// expiry and the marker after it was acknowledged (a review saw 2-3 of 400
// such rewrites wiped on R3). PutTombstone waits for the marker and writes
// on its revision. R3, many labels at once, each rewritten from 60 ms
// before its old tombstone's TTL to 340 ms after; about 9 s.
func TestATombstoneRewrittenAsTheOldOneExpiresSurvives(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, _, b := clusterBucket(t, ctx, BucketConfig{Name: DefaultBucket, MarkerTTL: time.Minute})
	tomb := func(model string) Record {
		now := time.Now()
		return Record{V: RecordVersion, State: StateInvalidated, Owner: "o", Started: now, Heartbeat: now, Model: model, Epoch: 1}
	}
	const batches, perBatch = 4, 100
	type trial struct {
		model string
		acked time.Duration // the rewrite's acknowledgement, after the old one's send + TTL
		err   error
	}
	var mu sync.Mutex
	var trials []trial
	var wg sync.WaitGroup
	for batch := range batches {
		for i := range perBatch {
			model := "m" + string(rune('a'+batch)) + strings.Repeat("x", i%7) + string(rune('A'+i%26)) + string(rune('a'+i/26))
			wg.Go(func() {
				sent := time.Now()
				if err := b.PutTombstone(ctx, "acme", model, 1, tomb(model), time.Second); err != nil {
					mu.Lock()
					trials = append(trials, trial{model: model, err: err})
					mu.Unlock()
					return
				}
				// The rewrite, sent from 60 ms before the old one's TTL to 340 ms after.
				offset := time.Duration(i%40)*10*time.Millisecond - 60*time.Millisecond
				time.Sleep(time.Until(sent.Add(time.Second + offset)))
				err := b.PutTombstone(ctx, "acme", model, 1, tomb(model), time.Hour)
				mu.Lock()
				trials = append(trials, trial{model: model, acked: time.Since(sent) - time.Second, err: err})
				mu.Unlock()
			})
		}
		time.Sleep(700 * time.Millisecond)
	}
	wg.Wait()
	time.Sleep(4 * time.Second) // every old tombstone's marker placed (they come up to ~2 s late)
	wiped, ok := 0, 0
	for _, tr := range trials {
		if tr.err != nil {
			continue
		}
		ok++
		got, err := b.Tombstone(ctx, 0, "acme", tr.model, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got.Rev == 0 {
			wiped++
			t.Errorf("model %s: PutTombstone (1 h TTL) returned nil %v after the old tombstone's TTL, and the tombstone is gone", tr.model, tr.acked)
		}
	}
	t.Logf("%d rewrites acknowledged, %d wiped", ok, wiped)
}
