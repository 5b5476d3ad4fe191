package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A waiter's hints: a computing record (a reservation, a heartbeat) is not
// worth a read; a committed record, a delete or purge, a marker and a
// record that does not decode (counted) are.
func TestWorthReading(t *testing.T) {
	now := time.Now()
	computing, _ := Record{V: RecordVersion, State: StateComputing, Owner: "o", Nonce: "n", Started: now, Heartbeat: now}.encode()
	msg := func(data []byte, hdr ...string) *nats.Msg {
		m := nats.NewMsg("$KV." + DefaultBucket + "." + kvKey(1))
		m.Data = data
		for i := 0; i+1 < len(hdr); i += 2 {
			m.Header.Set(hdr[i], hdr[i+1])
		}
		return m
	}
	var bad int
	onBad := func(error) { bad++ }
	if worthReading(msg(computing), onBad) {
		t.Fatal("a computing record woke the waiter")
	}
	for name, m := range map[string]*nats.Msg{
		"purge":  msg(nil, "KV-Operation", "PURGE"),
		"delete": msg(nil, "KV-Operation", "DEL"),
		"marker": msg(nil, jetstream.MarkerReasonHeader, "MaxAge"),
	} {
		if !worthReading(m, onBad) {
			t.Errorf("%s did not wake the waiter", name)
		}
	}
	if bad != 0 {
		t.Fatalf("%d bad records counted before any", bad)
	}
	if !worthReading(msg([]byte("not a record")), onBad) || bad != 1 {
		t.Fatalf("a record that does not decode: bad %d", bad)
	}
}

// Hints on a real server: a commit wakes the waiter, and so does a commit
// JetStream refused (a core subscription sees it), which is why a hint is
// only a reason to read the key: the read shows it still computing.
func TestHintsAreOnlyHints(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	wake, done, err := f.b.Hints(kvKey(3), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	l := f.acquire(t, 3)
	refused := l.Record()
	refused.State = StateCommitted
	if _, err := f.b.CompareAndSet(ctx, kvKey(3), l.Revision()+7, refused, time.Minute); !errors.Is(err, ErrLost) {
		t.Fatalf("a write on a wrong revision: %v", err)
	}
	awaitHint(t, wake)
	if cur := f.read(t, kvKey(3)); !cur.Live || cur.Record.State != StateComputing {
		t.Fatalf("after a refused commit the key reads %+v", cur)
	}
	if _, err := commit(ctx, l, 3); err != nil {
		t.Fatal(err)
	}
	awaitHint(t, wake)
	if cur := f.read(t, kvKey(3)); cur.Record.State != StateCommitted {
		t.Fatalf("after the commit the key reads %+v", cur)
	}
}

func awaitHint(t *testing.T, wake <-chan struct{}) {
	t.Helper()
	select {
	case <-wake:
	case <-time.After(20 * time.Second):
		t.Fatal("no hint in 20s")
	}
}
