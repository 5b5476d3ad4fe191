package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The agent says where its values go when it starts (an agent whose
// values other nodes cannot pull shares nothing across nodes, silently
// otherwise: a new user's trial ran into it), and "stopped" once it has.
func TestAgentSaysWhereItsValuesGoAndThatItStopped(t *testing.T) {
	url, _, _ := startServe(t)
	dir := t.TempDir()
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{nil, "values: shm files only this node reads"},
		{[]string{"--advertise", "http://127.0.0.1:7400"}, "values: http, pulled from http://127.0.0.1:7400"},
	} {
		name := fmt.Sprint(len(c.flags))
		agent, lines := startLines(t, append([]string{"agent", "--nats", url, "--node", "a" + name,
			"--shm-dir", filepath.Join(dir, "shm"+name), "--socket", filepath.Join(dir, "run"+name, "agent.sock")}, c.flags...)...)
		var seen []string
		for l := range lines {
			seen = append(seen, l)
			if strings.Contains(l, "listening on") {
				break
			}
		}
		if last := seen[len(seen)-1]; !strings.Contains(last, c.want) {
			t.Fatalf("%v: the start line %q does not say %q", c.flags, last, c.want)
		}
		agent.Process.Signal(os.Interrupt)
		for l := range lines {
			seen = append(seen, l)
		}
		agent.Wait()
		if last := seen[len(seen)-1]; last != "embcache agent: stopped" {
			t.Fatalf("%v: after SIGINT the last line is %q:\n%s", c.flags, last, strings.Join(seen, "\n"))
		}
	}
}
