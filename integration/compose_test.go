package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/embcache/embcache/internal/mooncaketest"
)

// TestCompose runs scripts/compose-test.sh: the docker-compose cluster
// (three NATS nodes, reconciler, encoder, three prefill workers), a
// workload through it, and one NATS node killed on the way. It skips when
// no Docker engine answers, unless EMBCACHE_REQUIRE_DOCKER=1 (as in CI).
func TestCompose(t *testing.T) {
	root := composeRoot(t)
	buildStatic(t, root)
	runComposeTest(t, root, nil)
}

// TestComposeMooncake runs scripts/compose-test.sh mooncake: the same
// cluster with docker-compose.mooncake.yml over it, its payloads in a real
// Mooncake Store (a mooncake_master, the reconciler holding the segment,
// the workers writing and pulling through it), from an image of
// bin/embcache-mooncake and the Mooncake install mooncaketest.Dir names
// (make test unpacks ../shared/mooncake's bundle), with the shared
// libraries they load. The script checks the master's and the workers'
// counters for the bytes that went through Mooncake.
func TestComposeMooncake(t *testing.T) {
	root := composeRoot(t)
	dir, err := filepath.Abs(mooncaketest.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	buildStatic(t, root)
	build := exec.Command("go", "build", "-trimpath", "-tags", "mooncake", "-o", filepath.Join(root, "bin", "embcache-mooncake"), "./cmd/embcache")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building bin/embcache-mooncake: %v\n%s", err, out)
	}
	runComposeTest(t, root, []string{"MOONCAKE_DIR=" + dir}, "mooncake")
}

// composeRoot skips unless a Docker engine answers (EMBCACHE_REQUIRE_DOCKER=1
// makes that a failure) and returns the repository's root.
func composeRoot(t *testing.T) string {
	t.Helper()
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
	return root
}

// buildStatic builds bin/embcache, the static binary of embcache:dev.
func buildStatic(t *testing.T, root string) {
	t.Helper()
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(root, "bin", "embcache"), "./cmd/embcache")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the static binary: %v\n%s", err, out)
	}
}

// runComposeTest runs scripts/compose-test.sh with args, env added.
func runComposeTest(t *testing.T, root string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"scripts/compose-test.sh"}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("compose-test %v: %v\n%s", args, err, out)
	}
	t.Logf("%s", out)
}
