package events_test

import (
	"fmt"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/payload"
)

// A State folds the stream's events into the values the cluster holds:
// one published, then touched (its life extended), then another of the
// same model and epoch published, and both invalidated at once.
func ExampleState_Apply() {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	value := func(i byte) (cachekey.Key, *payload.Location) {
		k := cachekey.Key{i}
		return k, &payload.Location{Transport: payload.TransportShm, Node: "host-a",
			Object: payload.ObjectID{Tenant: "acme", Key: k}.String(), Size: 64}
	}
	k1, loc1 := value(1)
	k2, loc2 := value(2)
	s := events.NewState()
	s.Apply(events.Event{Kind: events.KindPublished, Tenant: "acme", Key: k1, Model: "m", Epoch: 1,
		Time: now, Expires: now.Add(time.Hour), Location: loc1})
	s.Apply(events.Event{Kind: events.KindTouched, Tenant: "acme", Key: k1, Model: "m", Epoch: 1,
		Time: now.Add(time.Minute), Expires: now.Add(2 * time.Hour), Location: loc1})
	s.Apply(events.Event{Kind: events.KindPublished, Tenant: "acme", Key: k2, Model: "m", Epoch: 1,
		Time: now.Add(time.Minute), Expires: now.Add(time.Hour), Location: loc2})
	e, _ := s.Get(payload.ObjectID{Tenant: "acme", Key: k1})
	fmt.Println("values:", len(s.Live(now)), "first expires in", e.Expires.Sub(now))
	fmt.Println("live in 90 minutes:", len(s.Live(now.Add(90*time.Minute))))
	s.Apply(events.Event{Kind: events.KindInvalidated, Tenant: "acme", Model: "m", Epoch: 1, Time: now.Add(2 * time.Minute)})
	fmt.Println("after the invalidation:", len(s.Live(now)))
	// Output:
	// values: 2 first expires in 2h0m0s
	// live in 90 minutes: 1
	// after the invalidation: 0
}
