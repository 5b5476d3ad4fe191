package main

import (
	"testing"

	"github.com/spf13/cobra"
)

// A worker is short-lived: it contributes no Mooncake segment unless told
// to, while the node's long-lived processes (serve, the agent) hold one
// by default (docs/operations.md, Mooncake).
func TestOnlyLongLivedProcessesHoldAMooncakeSegmentByDefault(t *testing.T) {
	for _, c := range []struct {
		cmd  *cobra.Command
		want string
	}{{newWorker(), "0"}, {newAgent(), "536870912"}, {newServe(), "536870912"}} {
		f := c.cmd.Flags().Lookup("mooncake-segment-bytes")
		if f == nil || f.Value.String() != c.want {
			t.Fatalf("%s --mooncake-segment-bytes: %v, want %s", c.cmd.Name(), f, c.want)
		}
	}
}
