package main

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/live"
	"github.com/nats-io/nats-server/v2/server"
)

// TestPageListensOnItsOwnConnection: serve's page, once polled, hears
// the summaries and every lease write on a NATS connection of its own,
// made with serve's credentials, and not on the connection serve's node
// (its reconciler) uses; none listens before the page is polled.
func TestPageListensOnItsOwnConnection(t *testing.T) {
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Username: "op", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	out := startProcess(t, "serve", "--nats", srv.ClientURL(), "--user", "op", "--password", "pw", "--node", "n1",
		"--shm-dir", filepath.Join(t.TempDir(), "shm"), "--metrics-listen", "127.0.0.1:0")
	waitOutput(t, out, "embcache serve: ready", "")
	page := "http://" + waitOutput(t, out, "embcache serve: live view at http://", "/")
	// The subjects each connection subscribes to, by its name.
	subs := func() map[string][]string {
		t.Helper()
		cz, err := srv.NATS().Connz(&server.ConnzOptions{Subscriptions: true})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string][]string{}
		for _, c := range cz.Conns {
			m[c.Name] = append(m[c.Name], c.Subs...)
		}
		return m
	}
	listening := func(m map[string][]string) []string {
		var names []string
		for name, s := range m {
			if slices.Contains(s, lease.StoredWildcard) || slices.Contains(s, live.TenantSubjects("")) {
				names = append(names, name)
			}
		}
		return names
	}
	if names := listening(subs()); len(names) != 0 {
		t.Fatalf("listening before the page is polled: %v", names)
	}
	resp, err := scraper.Get(page + "/api/live")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var m map[string][]string
	for deadline := time.Now().Add(20 * time.Second); ; {
		m = subs()
		if s := m["embcache serve page"]; slices.Contains(s, lease.StoredWildcard) && slices.Contains(s, live.TenantSubjects("")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection of the page's own listens: %v\n%s", m, out.String())
		}
		time.Sleep(50 * time.Millisecond) // polling another process
	}
	if names := listening(m); len(names) != 1 {
		t.Fatalf("connections that listen: %v (subscriptions %v)", names, m)
	}
}
