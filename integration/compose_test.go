package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestCompose runs scripts/compose-test.sh: the docker-compose cluster
// (three NATS nodes, reconciler, encoder, three prefill workers), a
// workload through it, and one NATS node killed on the way. It skips when
// no Docker engine answers, unless EMBCACHE_REQUIRE_DOCKER=1 (as in CI).
func TestCompose(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image and runs a cluster")
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		if os.Getenv("EMBCACHE_REQUIRE_DOCKER") == "1" {
			t.Fatalf("EMBCACHE_REQUIRE_DOCKER=1 but no Docker engine answers: %v", err)
		}
		t.Skipf("no Docker engine: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(root, "bin", "embcache"), "./cmd/embcache")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the static binary: %v\n%s", err, out)
	}
	cmd := exec.Command("bash", "scripts/compose-test.sh")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("compose-test: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
