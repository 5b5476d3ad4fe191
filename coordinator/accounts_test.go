package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The tenant boundary of docs/operations.md ("Tenant isolation"): one NATS
// account per tenant, as deploy/nats-accounts.conf lays it out, against
// the older layout of every tenant in one account with per-user subject
// permissions (TenantPermissions, tenant_test.go). Tenant beta, with its
// own credentials only, attacks tenant acme in each layout; the account
// layout must hold, and the single-account one is expected to break
// (else the attack proves nothing, and the doc is wrong about it).

// accountsConfig is the example configuration the tests run.
const accountsConfig = "../deploy/nats-accounts.conf"

// accountPasswords names, for each user of accountsConfig, the
// environment variable its password comes from.
var accountPasswords = map[string]string{
	"sys":        "EMBCACHE_SYS_PASSWORD",
	"acme-admin": "EMBCACHE_ACME_ADMIN_PASSWORD",
	"acme":       "EMBCACHE_ACME_PASSWORD",
	"beta-admin": "EMBCACHE_BETA_ADMIN_PASSWORD",
	"beta":       "EMBCACHE_BETA_PASSWORD",
}

// testMaxFile is each account's max_file in these tests, instead of the
// example's 4GiB, which would take minutes to fill.
const testMaxFile = "4MiB"

// accountsConfigForTest writes accountsConfig with testMaxFile and sets
// the passwords it reads ("pw-<user>").
func accountsConfigForTest(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(accountsConfig)
	if err != nil {
		t.Fatal(err)
	}
	const example = "max_file: 4GiB"
	if n := strings.Count(string(raw), example); n != 2 {
		t.Fatalf("%s: %d accounts with %q, not ACME's and BETA's", accountsConfig, n, example)
	}
	conf := filepath.Join(t.TempDir(), "nats-accounts.conf")
	if err := os.WriteFile(conf, []byte(strings.ReplaceAll(string(raw), example, "max_file: "+testMaxFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	for user, env := range accountPasswords {
		t.Setenv(env, "pw-"+user)
	}
	return conf
}

// boundary is tenants acme and beta running on one server in one layout,
// after acme's caches have shared, waited on and invalidated values.
type boundary struct {
	accounts    bool   // one account per tenant; else one account for all
	acmeAccount string // the account acme's data is in: "ACME", or the shared "$G"
	url         string

	dialCreds func(user string) []nats.Option
	// The operators' views of each tenant's data (the same in the
	// single-account layout): what the tests check acme's state and
	// beta's effect with.
	acmeOps, betaOps jetstream.JetStream
	acmeStore        payload.Transport
	a1, a2           *Cache
	cnt              counter

	beta   *nats.Conn // beta's raw connection: beta's credentials only
	betaJS jetstream.JetStream

	mu      sync.Mutex
	closers []func() // guarded by mu

	shared, gone, betaRef Ref                                // acme's shared value, acme's invalidated model, beta's value
	before                map[string]*jetstream.RawStreamMsg // acme's record, tombstone and event after the baseline
}

// onClose has close run f.
func (b *boundary) onClose(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closers = append(b.closers, f)
}

// close closes the caches and stops the reconcilers, all at once: a
// Cache whose event stream an attack deleted takes its bounded time to
// close (seconds), and they would add up.
func (b *boundary) close() {
	b.mu.Lock()
	closers := b.closers
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, f := range closers {
		wg.Go(f)
	}
	wg.Wait()
}

const kvStream = "KV_" + lease.DefaultBucket

// kvSubject is the subject of a lease key's messages.
func kvSubject(key string) string { return "$KV." + lease.DefaultBucket + "." + key }

// acmeEventSubject is the subject of acme's invalidation event of b.gone.
func (b *boundary) acmeEventSubject() string {
	e := events.Event{Kind: events.KindInvalidated, Tenant: "acme", Key: events.InvalidationKey(b.gone.Model, b.gone.Epoch)}
	return e.Subject()
}

// lastMsg is the last message on subject in stream, as js sees it.
func lastMsg(ctx context.Context, js jetstream.JetStream, stream, subject string) (*jetstream.RawStreamMsg, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	return s.GetLastMsgForSubject(ctx, subject)
}

// startBoundary starts a server in one layout (accounts: the example
// configuration; else TenantPermissions), each tenant's operator (the
// bucket, the stream, a reconciler) and caches, and has acme's caches
// share, wait and invalidate, and beta's compute a value of its own.
func startBoundary(t *testing.T, accounts bool) *boundary {
	t.Helper()
	ctx := context.Background()
	b := &boundary{accounts: accounts}
	opts := embedded.Options{StoreDir: t.TempDir()}
	if accounts {
		opts.ConfigFile = accountsConfigForTest(t)
		b.acmeAccount = "ACME"
	} else {
		opts.Configure = func(o *server.Options) error {
			o.Users = []*server.User{
				{Username: "admin", Password: "pw-admin"},
				{Username: "acme", Password: "pw-acme", Permissions: TenantPermissions("acme")},
				{Username: "beta", Password: "pw-beta", Permissions: TenantPermissions("beta")},
			}
			return nil
		}
		b.acmeAccount = server.DEFAULT_GLOBAL_ACCOUNT
	}
	srv, err := embedded.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	t.Cleanup(b.close)
	b.url = srv.ClientURL()
	b.dialCreds = func(user string) []nats.Option {
		o := []nats.Option{nats.UserInfo(user, "pw-"+user)}
		if !accounts && user != "admin" {
			o = append(o, nats.CustomInboxPrefix("_INBOX_"+user))
		}
		return o
	}
	dial := func(user string) *nats.Conn {
		t.Helper()
		nc, err := Connect(b.url, ModeStrict, b.dialCreds(user)...)
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	// The operator's part, per account: what serve does (the bucket, the
	// stream, the reconciler) under the account's admin user.
	operator := func(user string, store payload.Transport) jetstream.JetStream {
		t.Helper()
		c, err := New(ctx, dial(user), WithEvents(0), WithEventsMaxBytes(events.MinMaxBytes), WithNode("test-node"),
			route(t, payload.TransportMemory, store))
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		b.onClose(func() { c.Close() })
		rec, err := reconciler.New(dial(user), reconciler.WithNode("test-node"), reconciler.WithLeaseTTL(time.Second),
			reconciler.WithDeleter(payload.TransportMemory, store), reconciler.WithEventsMaxBytes(events.MinMaxBytes))
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { rec.Run(rctx); close(done) }()
		b.onClose(func() { stop(); <-done })
		waitFor(t, func() bool { return rec.Stats().Active })
		js, err := jetstream.New(dial(user))
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	// Each tenant's node has its own payload store (its own --shm-dir);
	// in the single-account layout the tenants share one node.
	b.acmeStore = payload.NewMemoryStore("test-node", 0)
	betaStore := b.acmeStore
	if accounts {
		betaStore = payload.NewMemoryStore("test-node", 0)
		b.acmeOps, b.betaOps = operator("acme-admin", b.acmeStore), operator("beta-admin", betaStore)
	} else {
		b.acmeOps = operator("admin", b.acmeStore)
		b.betaOps = b.acmeOps
	}
	tenantCache := func(user string, store payload.Transport) *Cache {
		t.Helper()
		c, err := b.tenantCache(ctx, t, user, store)
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		return c
	}
	b.a1, b.a2 = tenantCache("acme", b.acmeStore), tenantCache("acme", b.acmeStore)
	b1 := tenantCache("beta", betaStore)
	b.beta = dial("beta")
	if b.betaJS, err = jetstream.New(b.beta); err != nil {
		t.Fatal(err)
	}

	// acme shares a value...
	b.shared = ref(1)
	if _, path, err := b.a1.GetOrComputePath(ctx, "r", b.shared, b.cnt.fn(1)); err != nil || path != PathComputed {
		t.Fatalf("acme computes: %v %v", path, err)
	}
	if _, path, err := b.a2.GetOrComputePath(ctx, "r", b.shared, b.cnt.fn(1)); err != nil || path != PathRemoteHit {
		t.Fatalf("acme shares: %v %v", path, err)
	}
	// ...waits on another's compute...
	waited := ref(3)
	r, err := b.a1.Reserve(ctx, waited)
	if err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, path, err := b.a2.GetOrComputePath(ctx, "w", waited, b.cnt.fn(3))
		if err == nil && path != PathWaited {
			err = fmt.Errorf("path %v", path)
		}
		waitErr <- err
	}()
	waitFor(t, func() bool { return b.a2.Stats().Waits == 1 })
	if _, err := r.Commit(ctx, embedding(3)); err != nil {
		t.Fatal(err)
	}
	if err := <-waitErr; err != nil {
		t.Fatalf("acme's waiter: %v", err)
	}
	// ...and invalidates a model, whose copies leave its other cache.
	b.gone = ref(4)
	b.gone.Model = "gone"
	for _, c := range []*Cache{b.a1, b.a2} {
		if _, err := c.GetOrCompute(ctx, "g", b.gone, b.cnt.fn(4)); err != nil {
			t.Fatal(err)
		}
		c.Release("g")
	}
	if err := b.a1.Invalidate(ctx, "acme", b.gone.Model, b.gone.Epoch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !b.a2.local.Contains(b.gone.local()) })
	for _, c := range []*Cache{b.a1, b.a2} {
		c.Release("r")
		c.Release("w")
	}
	// beta has a value of its own.
	b.betaRef = ref(2)
	b.betaRef.Tenant = "beta"
	if _, path, err := b1.GetOrComputePath(ctx, "r", b.betaRef, b.cnt.fn(2)); err != nil || path != PathComputed {
		t.Fatalf("beta computes: %v %v", path, err)
	}
	b1.Release("r")

	b.before = map[string]*jetstream.RawStreamMsg{}
	for what, at := range b.acmeState() {
		m, err := lastMsg(ctx, b.acmeOps, at[0], at[1])
		if err != nil {
			t.Fatalf("acme's %s: %v", what, err)
		}
		b.before[what] = m
	}
	return b
}

// acmeState is where acme's record, tombstone and invalidation event are:
// stream and subject.
func (b *boundary) acmeState() map[string][2]string {
	return map[string][2]string{
		"record":             {kvStream, kvSubject(b.shared.KVKey())},
		"tombstone":          {kvStream, kvSubject(lease.TombstoneKey("acme", b.gone.Model, b.gone.Epoch))},
		"invalidation event": {events.StreamName, b.acmeEventSubject()},
	}
}

// tenantCache is a worker's Cache with user's credentials: in the
// single-account layout restricted to its tenant, as there it must be;
// in its own account it needs nothing of the kind.
func (b *boundary) tenantCache(ctx context.Context, t *testing.T, user string, store payload.Transport) (*Cache, error) {
	nc, err := Connect(b.url, ModeStrict, b.dialCreds(user)...)
	if err != nil {
		return nil, err
	}
	opts := []Option{WithMode(ModeStrict), WithEvents(0), route(t, payload.TransportMemory, store), WithNode("test-node"),
		WithOpTimeout(time.Second)}
	if !b.accounts {
		opts = append(opts, WithTenants(user))
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := New(ctx, nc, opts...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	b.onClose(func() { c.Close(); nc.Close() })
	return c, nil
}

// harm is what an attack changed of acme's: its record, tombstone and
// event overwritten or gone, its stream gone, its value no longer served
// (or another one served in its place) to a cache of acme's that starts
// now, its caches no longer sharing.
func (b *boundary) harm(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	var harm []string
	for what, at := range b.acmeState() {
		m, err := lastMsg(ctx, b.acmeOps, at[0], at[1])
		switch was := b.before[what]; {
		case err != nil:
			harm = append(harm, fmt.Sprintf("acme's %s is gone (%v)", what, err))
		case m.Sequence != was.Sequence || !bytes.Equal(m.Data, was.Data):
			harm = append(harm, fmt.Sprintf("acme's %s was overwritten with %.80q", what, m.Data))
		}
	}
	if _, err := b.acmeOps.Stream(ctx, events.StreamName); err != nil {
		harm = append(harm, fmt.Sprintf("acme's event stream is gone (%v)", err))
	}
	fresh, err := b.tenantCache(ctx, t, "acme", b.acmeStore)
	if err != nil {
		return append(harm, fmt.Sprintf("a new cache of acme's does not start: %v", err))
	}
	switch v, path, err := fresh.GetOrComputePath(ctx, "check", b.shared, b.cnt.fn(1)); {
	case err != nil:
		harm = append(harm, fmt.Sprintf("acme's shared value: %v", err))
	case !bytes.Equal(v.Tensor.Data, embedding(1).Tensor.Data):
		harm = append(harm, "acme's cache was served another value for its key")
	case path != PathRemoteHit:
		harm = append(harm, fmt.Sprintf("acme's shared value is no longer served from its record (path %v)", path))
	}
	fresh.Release("check")
	next := ref(5)
	if _, path, err := b.a1.GetOrComputePath(ctx, "n", next, b.cnt.fn(5)); err != nil || path != PathComputed {
		harm = append(harm, fmt.Sprintf("acme computes a new key: %v %v", path, err))
	} else if _, path, err := b.a2.GetOrComputePath(ctx, "n", next, b.cnt.fn(5)); err != nil || path != PathRemoteHit {
		harm = append(harm, fmt.Sprintf("acme's caches no longer share a new key: %v %v", path, err))
	}
	return harm
}

// changed waits until js's last message on subject in stream is not
// was (nil: until there is one), and returns it.
func changed(t *testing.T, js jetstream.JetStream, stream, subject string, was *jetstream.RawStreamMsg) *jetstream.RawStreamMsg {
	t.Helper()
	var m *jetstream.RawStreamMsg
	waitFor(t, func() bool {
		var err error
		m, err = lastMsg(context.Background(), js, stream, subject)
		return err == nil && (was == nil || m.Sequence != was.Sequence)
	})
	return m
}

// last is js's last message on subject in stream, or nil.
func last(js jetstream.JetStream, stream, subject string) *jetstream.RawStreamMsg {
	m, _ := lastMsg(context.Background(), js, stream, subject)
	return m
}

// publish sends m on beta's connection, and flushes.
func (b *boundary) publish(t *testing.T, m *nats.Msg) {
	t.Helper()
	if err := b.beta.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	if err := b.beta.Flush(); err != nil {
		t.Fatal(err)
	}
}

// boundaryAttacks are beta's attempts on acme's state, made with beta's
// own credentials (and within its permissions, in the single-account
// layout). Each returns what beta learned of acme's, and checks that its
// attempt took effect where it landed (in the account layout: in beta's
// own account), so that an attack that "held" is not one that did nothing.
var boundaryAttacks = []struct {
	name string
	run  func(t *testing.T, b *boundary) (learned []string)
}{
	{"reply subject of a publish names acme's key", func(t *testing.T, b *boundary) []string {
		// JetStream acknowledges the publish of beta's own key to the
		// reply subject, which is acme's key: the acknowledgement is
		// stored as acme's record. Publish permissions are checked on the
		// subject, not on the reply subject.
		target := kvSubject(b.shared.KVKey())
		was := last(b.betaOps, kvStream, target)
		b.publish(t, &nats.Msg{Subject: kvSubject(b.betaRef.KVKey()), Reply: target, Data: []byte("x")})
		m := changed(t, b.betaOps, kvStream, target, was)
		t.Logf("the acknowledgement landed on %s in %s: %q", target, b.where(), m.Data)
		return nil
	}},
	{"reply subject of a direct get names acme's key", func(t *testing.T, b *boundary) []string {
		// JetStream answers a direct get of a record of beta's to acme's
		// key, headers and all: beta's committed record (the location of
		// beta's value), copied to a key of beta's by a plain publish
		// (the original's expected-revision header would refuse the
		// answer), is stored as acme's.
		own := last(b.betaOps, kvStream, kvSubject(b.betaRef.KVKey()))
		if own == nil {
			t.Fatal("beta's record is gone")
		}
		if _, err := b.betaJS.Publish(context.Background(), kvSubject("beta.forged"), own.Data); err != nil {
			t.Fatal(err)
		}
		target := kvSubject(b.shared.KVKey())
		was := last(b.betaOps, kvStream, target)
		b.publish(t, &nats.Msg{Subject: "$JS.API.DIRECT.GET." + kvStream + "." + kvSubject("beta.forged"), Reply: target})
		if m := changed(t, b.betaOps, kvStream, target, was); !bytes.Equal(m.Data, own.Data) {
			t.Errorf("what landed on %s is not beta's record: %.80q", target, m.Data)
		}
		t.Logf("beta's record landed on %s in %s", target, b.where())
		return nil
	}},
	{"reply subject names acme's event", func(t *testing.T, b *boundary) []string {
		// The acknowledgement of an event of beta's is stored as acme's
		// invalidation event (the stream keeps one per subject).
		target := b.acmeEventSubject()
		was := last(b.betaOps, events.StreamName, target)
		b.publish(t, &nats.Msg{Subject: events.SubjectPrefix + "beta.x", Reply: target, Data: []byte("x")})
		m := changed(t, b.betaOps, events.StreamName, target, was)
		t.Logf("the acknowledgement landed on %s in %s: %q", target, b.where(), m.Data)
		return nil
	}},
	{"reply subject names a JetStream API call", func(t *testing.T, b *boundary) []string {
		// The API ignores a bare acknowledgement (it carries no client
		// info header), but a direct get answers with the record's own
		// headers: beta stores a record whose header names acme's
		// account as the caller, and has it answered to
		// $JS.API.STREAM.DELETE.EMBCACHE_EVENTS.
		ctx := context.Background()
		s, err := b.betaOps.Stream(ctx, events.StreamName)
		if err != nil {
			t.Fatal(err)
		}
		created := s.CachedInfo().Created
		forged := nats.NewMsg(kvSubject("beta.api"))
		forged.Header.Set("Nats-Request-Info", `{"acc":"`+b.acmeAccount+`"}`)
		if _, err := b.betaJS.PublishMsg(ctx, forged); err != nil {
			t.Fatal(err)
		}
		b.publish(t, &nats.Msg{Subject: "$JS.API.DIRECT.GET." + kvStream + "." + kvSubject("beta.api"),
			Reply: "$JS.API.STREAM.DELETE." + events.StreamName})
		// The stream beta's subjects go to is deleted (and may be made
		// again by the operator's processes: a new one).
		waitFor(t, func() bool {
			s, err := b.betaOps.Stream(ctx, events.StreamName)
			return errors.Is(err, jetstream.ErrStreamNotFound) || (err == nil && !s.CachedInfo().Created.Equal(created))
		})
		t.Logf("the event stream of %s was deleted", b.where())
		return nil
	}},
	{"rollup of its own key", func(t *testing.T, b *boundary) []string {
		// The lease bucket allows rollups (a purge is one), and
		// "Nats-Rollup: all" removes every message of the stream.
		m := nats.NewMsg(kvSubject(b.betaRef.KVKey()))
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupAll)
		if _, err := b.betaJS.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		s, err := b.betaOps.Stream(context.Background(), kvStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 1 {
			t.Errorf("after the rollup the bucket of %s holds %d messages, not the rollup's alone", b.where(), info.State.Msgs)
		}
		return nil
	}},
	{"stream info and listing", func(t *testing.T, b *boundary) []string {
		// What the stream info lists (the subjects of every key and
		// event), and the account's streams.
		var listed []string
		for _, req := range []struct{ subject, body string }{
			{"$JS.API.STREAM.INFO." + kvStream, `{"subjects_filter":">"}`},
			{"$JS.API.STREAM.INFO." + events.StreamName, `{"subjects_filter":">"}`},
			{"$JS.API.STREAM.NAMES", `{}`},
			{"$JS.API.STREAM.LIST", `{}`},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			resp, err := b.beta.RequestWithContext(ctx, req.subject, []byte(req.body))
			cancel()
			if err != nil {
				continue // refused: a denied request is never answered
			}
			var info struct {
				State struct {
					Subjects map[string]uint64 `json:"subjects"`
				} `json:"state"`
				Streams []json.RawMessage `json:"streams"`
			}
			if err := json.Unmarshal(resp.Data, &info); err != nil {
				t.Fatalf("%s: %v", req.subject, err)
			}
			for s := range info.State.Subjects {
				listed = append(listed, s)
			}
			for _, s := range info.Streams {
				listed = append(listed, string(s))
			}
		}
		var learned []string
		own := false
		for _, s := range listed {
			own = own || strings.Contains(s, ".beta.")
			if strings.Contains(s, "acme") {
				learned = append(learned, "beta listed "+s)
			}
		}
		if !own {
			t.Errorf("beta listed none of its own subjects: the listing proves nothing")
		}
		return learned
	}},
	{"filling storage", func(t *testing.T, b *boundary) []string {
		// 1.5 MiB of events into a stream of 1 MiB (discarding the
		// oldest), and lease records until JetStream refuses them (or
		// 8 MiB, twice the account limit).
		ctx := context.Background()
		big := bytes.Repeat([]byte("x"), 64<<10)
		for i := range 24 {
			if _, err := b.betaJS.Publish(ctx, fmt.Sprintf("%sbeta.fill.%d", events.SubjectPrefix, i), big); err != nil {
				t.Fatal(err)
			}
		}
		bigger := bytes.Repeat([]byte("x"), 512<<10)
		var refused error
		stored := 0
		for i := 0; i < 16 && refused == nil; i++ {
			if _, refused = b.betaJS.Publish(ctx, kvSubject(fmt.Sprintf("beta.fill.%d", i)), bigger); refused == nil {
				stored += len(bigger)
			}
		}
		if refused == nil {
			return []string{fmt.Sprintf("nothing limits beta's storage: it stored %d MiB of records", stored>>20)}
		}
		t.Logf("beta's records refused after %d MiB: %v", stored>>20, refused)
		return nil
	}},
}

// where names the account an attack landed in.
func (b *boundary) where() string {
	if b.accounts {
		return "beta's own account"
	}
	return "the one account of every tenant"
}

// TestTenantBoundary: each attack of beta's, in each layout. In the
// account layout (deploy/nats-accounts.conf) acme's records, tombstone,
// event and stream are intact afterwards and its caches share as before;
// what beta did landed in its own account. In the single-account layout
// (TenantPermissions) the same attack harms acme.
func TestTenantBoundary(t *testing.T) {
	for _, a := range boundaryAttacks {
		t.Run(a.name, func(t *testing.T) {
			t.Run("accounts", func(t *testing.T) {
				b := startBoundary(t, true)
				harm := append(a.run(t, b), b.harm(t)...)
				for _, h := range harm {
					t.Errorf("an account of its own did not protect acme: %s", h)
				}
			})
			t.Run("single account", func(t *testing.T) {
				b := startBoundary(t, false)
				harm := append(a.run(t, b), b.harm(t)...)
				if len(harm) == 0 {
					t.Fatal("the single-account layout held: docs/operations.md says it does not")
				}
				t.Logf("broken, as expected: %s", strings.Join(harm, "; "))
			})
		})
	}
}

// TestUsersWithinAnAccountAreNoBoundary: inside an account, a user whose
// permissions deny the JetStream API's stream deletes and purges still
// deletes the account's event stream (the reply subject of a direct get)
// and wipes its bucket (a rollup). What a tenant's own credentials can do
// to the tenant's own state is limited by giving it an account, not by
// its users' permissions.
func TestUsersWithinAnAccountAreNoBoundary(t *testing.T) {
	conf := accountsConfigForTest(t)
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), ConfigFile: conf, Configure: func(o *server.Options) error {
		for _, acc := range o.Accounts {
			if acc.Name == "BETA" {
				o.Users = append(o.Users, &server.User{Username: "beta-worker", Password: "pw-beta-worker", Account: acc,
					Permissions: &server.Permissions{Publish: &server.SubjectPermission{
						Deny: []string{"$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.PURGE.>", "$JS.API.STREAM.UPDATE.>"}}}})
				return nil
			}
		}
		return errors.New("no account BETA")
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ctx := context.Background()
	admin := connectAs(t, srv.ClientURL(), "beta-admin")
	c, err := New(ctx, admin, WithEvents(0), WithEventsMaxBytes(events.MinMaxBytes), WithNode("test-node"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := ref(1)
	r.Tenant = "beta"
	var cnt counter
	if _, err := c.GetOrCompute(ctx, "r", r, cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	c.Release("r")
	ajs, _ := jetstream.New(admin)

	worker := connectAs(t, srv.ClientURL(), "beta-worker")
	js, _ := jetstream.New(worker)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := worker.RequestWithContext(short, "$JS.API.STREAM.DELETE."+events.StreamName, nil); err == nil {
		t.Fatal("the worker's delete request was answered: its permissions do not deny it")
	}
	forged := nats.NewMsg(kvSubject("beta.api"))
	forged.Header.Set("Nats-Request-Info", `{"acc":"BETA"}`)
	if _, err := js.PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}
	if err := worker.PublishMsg(&nats.Msg{Subject: "$JS.API.DIRECT.GET." + kvStream + "." + kvSubject("beta.api"),
		Reply: "$JS.API.STREAM.DELETE." + events.StreamName}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		_, err := ajs.Stream(ctx, events.StreamName)
		return errors.Is(err, jetstream.ErrStreamNotFound)
	})
	rollup := nats.NewMsg(kvSubject("beta.x"))
	rollup.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupAll)
	if _, err := js.PublishMsg(ctx, rollup); err != nil {
		t.Fatal(err)
	}
	if _, err := lastMsg(ctx, ajs, kvStream, kvSubject(r.KVKey())); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("beta's record after the worker's rollup: %v", err)
	}
}

// connectAs connects with user's password from accountsConfigForTest.
func connectAs(t *testing.T, url, user string) *nats.Conn {
	t.Helper()
	nc, err := Connect(url, ModeStrict, nats.UserInfo(user, "pw-"+user))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestTenantsOnOneShmDirRemoveEachOthersPayloads: a Cache's payload sweep
// removes the files of its shm directory that no record in its bucket
// names. Two tenants in accounts of their own see different buckets, so
// on one shm directory acme's sweep removes beta's values: each tenant's
// processes need a --shm-dir of their own (or WithTenants, whose sweep
// leaves other tenants' files alone).
func TestTenantsOnOneShmDirRemoveEachOthersPayloads(t *testing.T) {
	conf := accountsConfigForTest(t)
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), ConfigFile: conf})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ctx := context.Background()
	store, err := shm.Open(filepath.Join(t.TempDir(), "shm"), shm.WithNode("test-node"))
	if err != nil {
		t.Fatal(err)
	}
	cache := func(user string, opts ...Option) *Cache {
		c, err := New(ctx, connectAs(t, srv.ClientURL(), user), append([]Option{WithNode("test-node"), shmRoute(t, store),
			WithPayloadSweep(-1)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	acme, beta := cache("acme-admin"), cache("beta-admin")
	acmeScoped := cache("acme-admin", WithTenants("acme"))
	var cnt counter
	r := ref(1)
	r.Tenant = "beta"
	if _, err := beta.GetOrCompute(ctx, "r", r, cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	beta.Release("r")
	path := store.Path(r.Object())
	if n := acmeScoped.sweepPayloads(ctx, 0); n != 0 {
		t.Fatalf("a sweep restricted to acme removed %d files", n)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("beta's value after acme's restricted sweep: %v", err)
	}
	if n := acme.sweepPayloads(ctx, 0); n != 1 {
		t.Fatalf("acme's sweep removed %d files, not beta's one", n)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("beta's value after acme's sweep: %v", err)
	}
}

// TestSystemAccountMonitorsEveryAccount: the operator's cross-account
// view is the system account's: its user sees every account's JetStream
// usage and streams (the server's JSZ), and none of their records (it has
// no JetStream, and a subject of its is no tenant's).
func TestSystemAccountMonitorsEveryAccount(t *testing.T) {
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), ConfigFile: accountsConfigForTest(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ctx := context.Background()
	for _, admin := range []string{"acme-admin", "beta-admin"} {
		c, err := New(ctx, connectAs(t, srv.ClientURL(), admin), WithEvents(0), WithEventsMaxBytes(events.MinMaxBytes),
			WithNode("test-node"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	sys := connectAs(t, srv.ClientURL(), "sys")
	resp, err := sys.Request("$SYS.REQ.SERVER.PING.JSZ", []byte(`{"accounts":true,"streams":true}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var jsz struct {
		Data struct {
			Accounts []struct {
				Name    string `json:"name"`
				Streams []struct {
					Name string `json:"name"`
				} `json:"stream_detail"`
			} `json:"account_details"`
		} `json:"data"`
	}
	if err := json.Unmarshal(resp.Data, &jsz); err != nil {
		t.Fatal(err)
	}
	seen := map[string][]string{}
	for _, a := range jsz.Data.Accounts {
		for _, s := range a.Streams {
			seen[a.Name] = append(seen[a.Name], s.Name)
		}
	}
	for _, acc := range []string{"ACME", "BETA"} {
		if got := strings.Join(seen[acc], ","); !strings.Contains(got, kvStream) || !strings.Contains(got, events.StreamName) {
			t.Errorf("the system account's JSZ lists %s's streams as %q", acc, got)
		}
	}
	js, err := jetstream.New(sys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx, kvStream); err == nil {
		t.Error("the system account's user reads a lease bucket")
	}
}

// TestAnEventStreamLargerThanTheAccountIsRefused: the event stream
// reserves its max bytes out of the account's max_file when it is made;
// one that does not fit is refused ("insufficient storage resources
// available"), and a Cache that would make it runs without events, saying
// so, and retries.
func TestAnEventStreamLargerThanTheAccountIsRefused(t *testing.T) {
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), ConfigFile: accountsConfigForTest(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ctx := context.Background()
	var warned atomic.Int64
	log := slog.New(logCounter{sub: "event stream unavailable", n: &warned})
	c, err := New(ctx, connectAs(t, srv.ClientURL(), "acme-admin"), WithEvents(0), WithEventsMaxBytes(8<<20),
		WithNode("test-node"), WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, func() bool { return warned.Load() > 0 })
	js, err := jetstream.New(connectAs(t, srv.ClientURL(), "acme-admin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx, events.StreamName); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("an event stream of 8 MiB in an account of %s: %v", testMaxFile, err)
	}
	if c.Stats().Events {
		t.Fatal("the Cache says it has its event stream")
	}
}
