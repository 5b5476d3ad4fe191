package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
)

// opsDocScript returns the `sh` fenced blocks of a Markdown document, in
// order, as one script (each block preceded by a `:` line naming where it
// comes from, so that bash -x shows it), and how many blocks it found.
// Blocks with any other info string (text, console) are not run.
func opsDocScript(doc []byte) (string, int) {
	var script strings.Builder
	blocks, inSh, inOther := 0, false, false
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		fence := strings.HasPrefix(strings.TrimSpace(text), "```")
		switch {
		case inSh && fence:
			inSh = false
			script.WriteString("\n")
		case inSh:
			script.WriteString(text + "\n")
		case inOther && fence:
			inOther = false
		case inOther:
		case fence && strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "```")) == "sh":
			inSh = true
			blocks++
			fmt.Fprintf(&script, ": docs/operations.md line %d\n", line)
		case fence:
			inOther = true
		}
	}
	return script.String(), blocks
}

// TestOperationsDoc runs the `sh` blocks of docs/operations.md in order, in
// one bash -e, as an operator pasting them would: from a directory whose
// bin/ holds embcache and the nats CLI, with the ports and directories the
// doc leaves to the environment set to free ports and temporary directories.
// The doc starts its own server in the background and stops it; every
// process left over is killed with the shell's process group.
func TestOperationsDoc(t *testing.T) {
	natsCLI, _ := filepath.Abs("../../bin/nats")
	if _, err := os.Stat(natsCLI); err != nil {
		t.Skip("bin/nats missing: run make tools (make test does)")
	}
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s missing: docs/operations.md uses it", tool)
		}
	}
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	script, blocks := opsDocScript(doc)
	if blocks < 5 {
		t.Fatalf("docs/operations.md has %d sh blocks; the test expects the serve, inspect, agent, invalidate and stop steps", blocks)
	}

	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"embcache": binary, "nats": natsCLI} {
		if err := os.Symlink(target, filepath.Join(dir, "bin", name)); err != nil {
			t.Fatal(err)
		}
	}
	// The files the doc names from the repository's root.
	deploy, _ := filepath.Abs("../../deploy")
	if err := os.Symlink(deploy, filepath.Join(dir, "deploy")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "operations.sh"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}

	// The doc's ports: distinct free ones.
	ports := map[int]bool{}
	for len(ports) < 3 {
		p, err := embedded.FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		ports[p] = true
	}
	var free []int
	for p := range ports {
		free = append(free, p)
	}
	// Nothing of the caller's NATS or embcache settings leaks into the doc's shell.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EMBCACHE_") && !strings.HasPrefix(kv, "NATS_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		fmt.Sprintf("NATS_PORT=%d", free[0]), fmt.Sprintf("METRICS_PORT=%d", free[1]), fmt.Sprintf("HTTP_PORT=%d", free[2]),
		"STORE_DIR="+filepath.Join(dir, "store"), "SHM_DIR="+filepath.Join(dir, "shm"))

	outPath := filepath.Join(dir, "operations.out")
	out, err := os.Create(outPath) // a file, not a pipe: a background process holding it cannot block Wait
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-x", "-o", "pipefail", "operations.sh")
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(func() { syscall.Kill(-pgid, syscall.SIGKILL) })
	runErr := cmd.Wait()

	report := func() string {
		var b strings.Builder
		for _, name := range []string{"operations.out", "serve.log", "agent.log", "acme-serve.log", "beta-serve.log"} {
			data, _ := os.ReadFile(filepath.Join(dir, name))
			fmt.Fprintf(&b, "--- %s\n%s", name, data)
		}
		return b.String()
	}
	if runErr != nil {
		t.Fatalf("docs/operations.md's sh blocks failed (%v); bash -x trace and logs:\n%s", runErr, report())
	}
	output, _ := os.ReadFile(outPath)
	serveLog, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
	for what, want := range map[string]string{
		"the worker computes a value":      `"path":"computed"`,
		"nats kv get shows it committed":   `"state":"committed"`,
		"the worker degrades without NATS": `"path":"degraded"`,
	} {
		if !bytes.Contains(output, []byte(want)) {
			t.Errorf("%s: no %s in the output\n%s", what, want, report())
		}
	}
	if !bytes.Contains(serveLog, []byte("embcache serve: stopped")) {
		t.Errorf("serve did not stop cleanly\n%s", report())
	}
	// Tenant isolation: each tenant's worker computes in its own account.
	if n := bytes.Count(output, []byte(`"image":7,"role":"encoder","path":"computed"`)); n != 3 {
		t.Errorf("input 7 computed %d times, not once alone and once per tenant account\n%s", n, report())
	}
	for _, log := range []string{"acme-serve.log", "beta-serve.log"} {
		if data, _ := os.ReadFile(filepath.Join(dir, log)); !bytes.Contains(data, []byte("embcache serve: stopped")) {
			t.Errorf("%s: serve did not stop cleanly\n%s", log, report())
		}
	}
}
