package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/natstest"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

// `events tail --count 1` exits once it printed its event, with more
// events behind it than its buffer holds. (It hung about one run in five:
// the subscription's stop waited for a handler blocked on the full
// buffer; a new user's walkthrough found it. 3 of 30 runs hung before the
// fix, 0 of 30 after.)
func TestEventsTailWithACountExits(t *testing.T) {
	srv := natstest.Server(t)
	js, err := jetstream.New(natstest.Connect(t, srv.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := events.EnsureStream(ctx, js, events.StreamConfig{Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i := range 70 { // more than Tail's buffer of 64
		k := cachekey.Key{byte(i), 7}
		loc := payload.Location{Transport: payload.TransportShm, Node: "n1", Address: "/dev/shm/embcache",
			Object: payload.ObjectID{Tenant: "acme", Key: k}.String(), Size: 128, Checksum: payload.Checksum{1}}
		ev := &events.Event{Kind: events.KindPublished, Tenant: "acme", Key: k, Model: "m", Epoch: 1, Node: "n1",
			Time: now, Expires: now.Add(time.Hour), Location: &loc}
		data, err := events.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, ev.Subject(), data); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		out, err := exec.CommandContext(c, binary, "events", "tail", "--kind", "published", "--from-start", "--count", "1",
			"--nats", srv.ClientURL()).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("run %d: %v (a hang is killed after 10 s)\n%s", i, err, out)
		}
	}
}

// A --kind that names no event kind is a usage error that says so (it
// read "events: bad event: unknown kind": a new user's walkthrough).
func TestTailRefusesAnUnknownKindAsAFlag(t *testing.T) {
	_, stderr, code := run(t, "events", "tail", "--nats", "nats://127.0.0.1:1", "--kind", "bogus")
	if code != 2 || !strings.Contains(stderr, `--kind "bogus" is not an event kind`) || strings.Contains(stderr, "bad event") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
}
