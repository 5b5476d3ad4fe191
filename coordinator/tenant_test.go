package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TenantPermissions is the permission layout of docs/operations.md for a
// tenant's workers in the older layout of every tenant in one account
// (TestTenantBoundary shows what it does not protect against): their own
// lease keys (written, read with direct gets, their stored changes
// subscribed to while waited on) and events, consumers filtered to them,
// their eviction notices, stream info, and replies on their own inbox
// prefix (_INBOX_<tenant>, set with nats.CustomInboxPrefix).
func TenantPermissions(tenant string) *server.Permissions {
	kv := "$KV." + lease.DefaultBucket + "." + tenant + ".>"
	stored := "embcache.stored." + lease.DefaultBucket + "." + tenant + ".>"
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{
			kv,
			"embcache.ev." + tenant + ".>",
			"embcache.sum." + tenant + ".>", // its live summaries (docs/protocol.md 5.3)
			"$JS.API.DIRECT.GET.KV_" + lease.DefaultBucket + "." + kv,
			"$JS.API.CONSUMER.CREATE." + events.StreamName + ".*.embcache.ev." + tenant + ".>",
			// Pulls from its (ordered) consumers, whose names are random
			// and cannot be listed.
			"$JS.API.CONSUMER.MSG.NEXT." + events.StreamName + ".*",
			"$JS.API.CONSUMER.INFO.*.*", "$JS.API.CONSUMER.DELETE.*.*",
			"$JS.API.STREAM.INFO.KV_" + lease.DefaultBucket, "$JS.API.STREAM.INFO." + events.StreamName,
			"$JS.FC.>",
		},
			// MSG.NEXT, INFO and DELETE above take any consumer's name: the
			// reconciler's durable (every tenant's events, under a name
			// everyone knows) is refused by name.
			Deny: []string{
				"$JS.API.CONSUMER.MSG.NEXT." + events.StreamName + "." + reconciler.Durable,
				"$JS.API.CONSUMER.INFO." + events.StreamName + "." + reconciler.Durable,
				"$JS.API.CONSUMER.DELETE." + events.StreamName + "." + reconciler.Durable,
			}},
		// The tenant's keys' stored changes while waiting on them, and the
		// eviction notices of its values to any node.
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX_" + tenant + ".>", stored, events.NoticePrefix + tenant + ".*"}},
	}
}

// TestTenantIsolation: with the layout above, tenant acme's workers share
// values among themselves, and acme's credentials can neither read nor
// write beta's leases, events or payloads.
func TestTenantIsolation(t *testing.T) {
	users := []*server.User{
		{Username: "admin", Password: "admin"},
		{Username: "acme", Password: "acme", Permissions: TenantPermissions("acme")},
		{Username: "beta", Password: "beta", Permissions: TenantPermissions("beta")},
	}
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Configure: func(o *server.Options) error {
		o.Users = users
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	url := srv.ClientURL()
	var denied sync.Map // what the caches' connections were refused: nothing
	dial := func(user string) *nats.Conn {
		t.Helper()
		opts := []nats.Option{nats.UserInfo(user, user), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			denied.Store(user+": "+err.Error(), true)
		})}
		if user != "admin" {
			opts = append(opts, nats.CustomInboxPrefix("_INBOX_"+user))
		}
		nc, err := Connect(url, ModeStrict, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctx := context.Background()
	// The operator creates the bucket and the stream, and runs the reconciler.
	admin, err := New(ctx, dial("admin"), WithEvents(0), WithNode("test-node"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	rec, err := reconciler.New(dial("admin"), reconciler.WithNode("test-node"))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRec := context.WithCancel(ctx)
	recDone := make(chan struct{})
	go func() { rec.Run(rctx); close(recDone) }()
	defer func() { stopRec(); <-recDone }()
	waitFor(t, func() bool { return rec.Stats().Active })

	store := payload.NewMemoryStore("test-node", 0)
	tenantCache := func(user string) *Cache {
		c, err := New(ctx, dial(user), WithMode(ModeStrict), WithTenants(user), WithEvents(0),
			route(t, payload.TransportMemory, store), WithNode("test-node"), WithOpTimeout(time.Second))
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a1, a2, b1 := tenantCache("acme"), tenantCache("acme"), tenantCache("beta")
	for _, c := range []*Cache{a1, a2, b1} {
		if !c.Stats().Events {
			t.Fatal("a tenant's cache has no event stream under the tenant permissions")
		}
	}
	var cnt counter
	acmeRef, betaRef := ref(1), ref(2)
	acmeRef.Tenant, betaRef.Tenant = "acme", "beta"
	if _, path, err := a1.GetOrComputePath(ctx, "r", acmeRef, cnt.fn(1)); err != nil || path != PathComputed {
		t.Fatalf("acme computes: %v %v", path, err)
	}
	if _, path, err := a2.GetOrComputePath(ctx, "r", acmeRef, cnt.fn(1)); err != nil || path != PathRemoteHit {
		t.Fatalf("acme shares: %v %v", path, err)
	}
	if _, path, err := b1.GetOrComputePath(ctx, "r", betaRef, cnt.fn(2)); err != nil || path != PathComputed {
		t.Fatalf("beta computes: %v %v", path, err)
	}
	if _, err := a1.GetOrCompute(ctx, "r", betaRef, cnt.fn(2)); !errors.Is(err, ErrTenant) {
		t.Fatalf("acme's cache asked for beta's key: %v", err)
	}
	// A wait under the tenant's credentials: a2 waits on a key a1 holds
	// (it subscribes to the key's stored changes).
	waitRef := ref(3)
	waitRef.Tenant = "acme"
	r, err := a1.Reserve(ctx, waitRef)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, path, err := a2.GetOrComputePath(ctx, "w", waitRef, cnt.fn(3))
		if err == nil && path != PathWaited {
			err = fmt.Errorf("path %v", path)
		}
		waited <- err
	}()
	waitFor(t, func() bool { return a2.Stats().Waits == 1 })
	if _, err := r.Commit(ctx, embedding(3)); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("acme's waiter: %v", err)
	}
	a1.Release("r")
	a2.Release("r")
	a2.Release("w")
	// An invalidation reaches the tenant's other caches through the
	// event stream, under the tenant's credentials.
	if err := a1.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !a2.local.Contains(acmeRef.local()) })
	denied.Range(func(k, _ any) bool {
		t.Errorf("a tenant cache's connection was refused: %s", k)
		return true
	})

	// Raw attempts with acme's credentials on beta's subjects.
	nc := dial("acme")
	js, _ := jetstream.New(nc)
	// Each attempt gets its own deadline: a denied request is never answered.
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	betaSubject := "$KV." + lease.DefaultBucket + "." + betaRef.KVKey()
	if _, err := js.Publish(short(), betaSubject, []byte(`{"v":1}`)); err == nil {
		t.Fatal("acme wrote beta's lease key")
	}
	if _, err := nc.RequestWithContext(short(), "$JS.API.DIRECT.GET.KV_"+lease.DefaultBucket+"."+betaSubject, nil); err == nil {
		t.Fatal("acme read beta's lease record")
	}
	if _, err := nc.RequestWithContext(short(), "$JS.API.STREAM.MSG.GET.KV_"+lease.DefaultBucket,
		[]byte(`{"last_by_subj":"`+betaSubject+`"}`)); err == nil {
		t.Fatal("acme read beta's lease record through MSG.GET")
	}
	kv, err := js.KeyValue(ctx, lease.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(short(), betaRef.KVKey()); err == nil {
		t.Fatal("acme read beta's key through the KV API")
	}
	if w, err := kv.Watch(short(), "beta.>"); err == nil {
		select {
		case e := <-w.Updates():
			if e != nil {
				t.Fatalf("acme watched beta's key %s", e.Key())
			}
		case <-time.After(500 * time.Millisecond):
		}
		w.Stop()
	}
	if _, err := js.Publish(short(), "embcache.ev.beta.published."+betaRef.Key.String(), []byte("x")); err == nil {
		t.Fatal("acme published a beta event")
	}
	if _, err := js.OrderedConsumer(short(), events.StreamName, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"embcache.ev.beta.>"}}); err == nil {
		// Creation is lazy for ordered consumers: fetching must fail.
		cons, _ := js.OrderedConsumer(short(), events.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"embcache.ev.beta.>"}})
		if msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond)); err == nil {
			for m := range msgs.Messages() {
				t.Fatalf("acme read beta's event %s", m.Subject())
			}
		}
	}
	if err := nc.Publish("_INBOX_beta.x", nil); err != nil && !strings.Contains(err.Error(), "permission") {
		t.Log(err)
	}
	// The reconciler's durable consumer (every tenant's events) cannot be
	// pulled from, looked at or deleted.
	for _, api := range []string{"MSG.NEXT", "INFO", "DELETE"} {
		if _, err := nc.RequestWithContext(short(), "$JS.API.CONSUMER."+api+"."+events.StreamName+"."+reconciler.Durable,
			[]byte(`{"batch":1,"expires":100000000}`)); err == nil {
			t.Fatalf("acme's %s on the reconciler's consumer was answered", api)
		}
	}
	for _, subject := range []string{"_INBOX_beta.>", betaSubject, "embcache.stored." + lease.DefaultBucket + "." + betaRef.KVKey(),
		events.NoticeSubject("beta", "test-node")} {
		other := dial("acme")
		if sub, err := other.SubscribeSync(subject); err == nil {
			other.Flush()
			if err := other.LastError(); err == nil || !strings.Contains(err.Error(), "Permissions Violation") {
				t.Fatalf("acme subscribed to %s: %v", subject, err)
			}
			sub.Unsubscribe()
		}
	}
}
