// Command embcache runs and inspects an embcache cluster: the one-command
// demo, a node (serve), the workers the demo and docker-compose run, key
// construction, and inspection of leases, events and stats.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes: 0 success, 1 failure, 2 bad usage or input.
const (
	exitFailure = 1
	exitUsage   = 2
)

// usageError marks an error as the caller's: exit code 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

var version = "dev"

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "embcache",
		Short:         "A cluster-wide cache for multimodal encoder outputs",
		Long:          "embcache makes one process in a cluster compute each image, video or audio embedding,\nand moves the tensor to every replica that needs it.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newDemo(), newWorker(), newServe(), newKey(), newLeases(), newEvents(), newStats(),
		newInvalidate(), newLoadgen(), newHealth(), newAgent(), newTop(), newVersion())
	for _, c := range root.Commands() {
		argsAreUsage(c)
	}
	return root
}

// argsAreUsage makes a command's argument errors usage errors (exit 2): a
// wrong number of arguments, and an unknown command under a group, which
// cobra reports from the group's argument check ('leases list' printed
// the group's help and exited 0). The root keeps cobra's own check, so
// that 'help TOPIC' still knows an unknown topic; main maps its error.
func argsAreUsage(c *cobra.Command) {
	check := c.Args
	if check == nil {
		check = cobra.NoArgs // what cobra checks by default of a command with subcommands (legacyArgs)
		if !c.HasSubCommands() {
			check = cobra.ArbitraryArgs
		}
	}
	if !c.Runnable() { // a group: cobra checks no arguments of a command that does not run
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	c.Args = func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
	for _, sub := range c.Commands() {
		argsAreUsage(sub)
	}
}

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "embcache:", err)
		var u usageError
		// cobra's error for an unknown command under the root has no
		// sentinel: it is told by its text (it exited 1).
		if errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command ") {
			os.Exit(exitUsage)
		}
		os.Exit(exitFailure)
	}
}

func newVersion() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "embcache", version) },
	}
}
