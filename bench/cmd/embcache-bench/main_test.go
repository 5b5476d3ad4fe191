package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

var binary string

// TestMain builds the command once; the tests run it as a user would (the
// workload suite re-executes it as its worker processes).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "embcache-bench-test-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "embcache-bench")
	args := []string{"build", "-o", binary}
	if mooncakeBuilt { // the command as this test was built: with the Mooncake transport
		args = append(args, "-tags", "mooncake")
	}
	if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building embcache-bench: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return o.String(), e.String(), exit.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), 0
}

// runJSON runs the command with args and --out, requires exit 0, and
// decodes the JSON it wrote into into; it returns its stdout and the JSON.
func runJSON(t *testing.T, into any, args ...string) (stdout string, raw []byte) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.json")
	stdout, stderr, code := run(t, append(args, "--out", out)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, into); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, raw)
	}
	return stdout, raw
}

func TestBenchQuick(t *testing.T) {
	var r struct {
		Rows     []benchRow    `json:"rows"`
		Workload []workloadRow `json:"workload"`
	}
	stdout, raw := runJSON(t, &r, "--quick")
	if len(r.Rows) != 21 || len(r.Workload) != len(allSystems) {
		t.Fatalf("bench JSON: %d rows, %d workload rows\n%s", len(r.Rows), len(r.Workload), raw)
	}
	for _, row := range r.Rows {
		if row.Ours <= 0 || row.Baseline <= 0 || row.Ratio <= 0 || !strings.Contains(stdout, row.Case) {
			t.Fatalf("row %+v", row)
		}
	}
	_, redisErr := exec.LookPath("redis-server")
	for _, w := range r.Workload {
		if w.System == sysRedis && redisErr != nil {
			t.Logf("redis-server is not installed (make test installs it): %s", w.Skipped)
			continue
		}
		if w.System == sysEmbcacheMC && mooncakeSkip(defaultMooncakeDir()) != "" {
			t.Logf("%s: %s", w.System, w.Skipped) // TestWorkloadMooncake runs it where it can
			continue
		}
		if w.Errors != 0 || w.Skipped != "" || w.RequestsPerSec <= 0 || !strings.Contains(stdout, w.System) {
			t.Fatalf("workload row %+v", w)
		}
		// The encoder alone takes CPU; a server's clock read may round to 0
		// (redis-server's is in 10 ms ticks) but not fail.
		if w.WorkerCPUms <= 0 || w.ServerCPUms < 0 {
			t.Fatalf("%s: worker CPU %v ms, server CPU %v ms", w.System, w.WorkerCPUms, w.ServerCPUms)
		}
		// Every system that shares computes across processes computes each input once.
		shares := w.System != sysNone && w.System != sysLocal
		if shares && w.Forwards != w.Unique && degraded(w) {
			// Under -race with every package's tests on 2 cores, an R3 write
			// can outlast the op timeout: the process then computes alone,
			// by design, and says so.
			t.Logf("%s: %d forwards for %d inputs while degraded: %+v", w.System, w.Forwards, w.Unique, w.Details)
			continue
		}
		if shares && (w.Forwards != w.Unique || w.MaxForwards != w.Unique) || w.System == sysNone && w.Forwards != w.Requests {
			t.Fatalf("%s: %d forwards for %d inputs, %d requests; per process: %+v", w.System, w.Forwards, w.Unique, w.Requests, w.Details)
		}
	}
	if _, _, code := run(t, "--suites", "nope"); code != 2 {
		t.Fatalf("unknown suite: exit %d", code)
	}
}

// The workload through a real Mooncake Store (make test-mooncake runs this
// with the tag and the store): each input is computed once, no request
// fails, and the values went through Mooncake.
func TestWorkloadMooncake(t *testing.T) {
	if why := mooncakeSkip(defaultMooncakeDir()); why != "" {
		if mooncakeBuilt && os.Getenv("EMBCACHE_REQUIRE_MOONCAKE") == "1" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	var r struct {
		Workload []workloadRow `json:"workload"`
	}
	stdout, raw := runJSON(t, &r, "--suites", "workload", "--quick", "--systems", sysEmbcacheMC)
	if len(r.Workload) != 1 {
		t.Fatalf("bench JSON:\n%s", raw)
	}
	w := r.Workload[0]
	if w.Errors != 0 || w.Skipped != "" || w.RequestsPerSec <= 0 || w.Forwards != w.Unique || !strings.Contains(stdout, sysEmbcacheMC) {
		t.Fatalf("workload row %+v", w)
	}
	// The processes read each other's values (remote hits and waits), from
	// Mooncake: no process serves them over HTTP in this system. None failed.
	var read, failed float64
	for _, d := range w.Details {
		if m, ok := d.(map[string]any); ok {
			for k, into := range map[string]*float64{"RemoteHits": &read, "Waits": &read, "PayloadErrors": &failed, "Degraded": &failed} {
				n, _ := m[k].(float64)
				*into += n
			}
		}
	}
	if read == 0 || failed != 0 {
		t.Fatalf("values read from another process: %v, payload errors and degraded computes: %v; %+v", read, failed, w.Details)
	}
}

// degraded reports whether an embcache process of the row computed without
// the store.
func degraded(w workloadRow) bool {
	for _, d := range w.Details {
		if m, ok := d.(map[string]any); ok {
			if n, _ := m["Degraded"].(float64); n > 0 {
				return true
			}
		}
	}
	return false
}

func TestScaleQuick(t *testing.T) {
	var r struct {
		Scale scaleResult `json:"scale"`
	}
	stdout, raw := runJSON(t, &r, "--suites", "scale", "--quick")
	if len(r.Scale.Processes) != 2 || len(r.Scale.Records) != 1 ||
		!strings.Contains(stdout, "msgs/forward") || !strings.Contains(stdout, "join to first hit") {
		t.Fatalf("scale JSON:\n%s\n%s", raw, stdout)
	}
	for _, row := range r.Scale.Processes {
		if row.Errors != 0 || row.Forwards < 40 || row.MsgsPerRequest <= 0 || row.MsgsPerForward <= row.MsgsPerRequest ||
			row.DeliveredPerRequest <= 0 {
			t.Fatalf("row %+v", row)
		}
	}
	// A new process's first request is a remote hit; the first reconciler
	// swept, the one after it did not.
	if row := r.Scale.Records[0]; row.Records != 1000 || row.JoinPath != "remote-hit" || row.FailoverSweeps != 0 ||
		row.ColdHeap == 0 || row.FailoverHeap == 0 {
		t.Fatalf("records row %+v", row)
	}
	if _, _, code := run(t, "--suites", "scale", "--scale-procs", "2,zero"); code != 2 {
		t.Fatalf("bad --scale-procs: exit %d", code)
	}
	if _, _, code := run(t, "--suites", "scale", "--scale-records", "-1"); code != 2 {
		t.Fatalf("bad --scale-records: exit %d", code)
	}
}
