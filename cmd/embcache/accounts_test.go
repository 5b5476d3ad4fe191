package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/embcache/embcache/embedded"
)

// TestServeInTenantAccounts runs two tenants as docs/operations.md lays
// them out ("Tenant isolation"): one NATS server with
// deploy/nats-accounts.conf, embedded by acme's serve, which beta's serve
// joins; each tenant's serve and workers with its own account's users and
// its own shm directory. Each tenant computes demo input 7 once and shares
// it among its own workers; neither sees the other's.
func TestServeInTenantAccounts(t *testing.T) {
	for user, env := range map[string]string{
		"sys": "EMBCACHE_SYS_PASSWORD", "acme-admin": "EMBCACHE_ACME_ADMIN_PASSWORD", "acme": "EMBCACHE_ACME_PASSWORD",
		"beta-admin": "EMBCACHE_BETA_ADMIN_PASSWORD", "beta": "EMBCACHE_BETA_PASSWORD",
	} {
		t.Setenv(env, "pw-"+user) // the file's passwords, in serve's environment
	}
	dir := t.TempDir()
	port, err := embedded.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	shmDir := func(tenant string) string { return filepath.Join(dir, "shm-"+tenant) }
	acme := startProcess(t, "serve", "--nats-config", "../../deploy/nats-accounts.conf", "--port", fmt.Sprint(port),
		"--store-dir", filepath.Join(dir, "js"), "--shm-dir", shmDir("acme"), "--node", "n1",
		"--user", "acme-admin", "--password", "pw-acme-admin")
	waitOutput(t, acme, "embcache serve: ready", "")
	beta := startProcess(t, "serve", "--nats", url, "--shm-dir", shmDir("beta"), "--node", "n1",
		"--user", "beta-admin", "--password", "pw-beta-admin")
	waitOutput(t, beta, "embcache serve: ready", "")

	worker := func(tenant string) string {
		t.Helper()
		cmd := exec.Command(binary, "worker", "--nats", url, "--user", tenant, "--password", "pw-"+tenant,
			"--shm-dir", shmDir(tenant), "--node", "n1", "--embed-mb", "0.01", "--encode-ms", "1", "--strict")
		cmd.Stdin = strings.NewReader(`{"id":1,"image":7,"cache":true}` + "\n")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s's worker: %v\n%s", tenant, err, out)
		}
		_, rest, ok := strings.Cut(string(out), `"path":"`)
		if !ok {
			t.Fatalf("%s's worker answered no path:\n%s", tenant, out)
		}
		path, _, _ := strings.Cut(rest, `"`)
		return path
	}
	for _, step := range []struct{ tenant, path string }{
		{"acme", "computed"}, {"acme", "remote-hit"}, // acme shares
		{"beta", "computed"}, {"beta", "remote-hit"}, // beta does not see acme's value, and shares its own
	} {
		if got := worker(step.tenant); got != step.path {
			t.Fatalf("%s's worker: path %s, not %s\nacme's serve:\n%s\nbeta's serve:\n%s", step.tenant, got, step.path, acme, beta)
		}
	}
	// Each admin user inspects its own account's bucket and stream.
	for _, admin := range []string{"acme-admin", "beta-admin"} {
		stdout, stderr, code := run(t, "stats", "--nats", url, "--user", admin, "--password", "pw-"+admin)
		if code != 0 || !strings.Contains(stdout, "EMBCACHE_LEASES") || !strings.Contains(stdout, "EMBCACHE_EVENTS") {
			t.Fatalf("stats as %s: exit %d\n%s%s", admin, code, stdout, stderr)
		}
	}
}
