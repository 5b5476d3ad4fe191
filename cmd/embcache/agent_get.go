package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"

	"github.com/embcache/embcache/agent"
	"github.com/spf13/cobra"
)

// newAgentGet is a Go process using the agent as the Python client does:
// look an input up, and if this process must compute, commit a file's bytes.
func newAgentGet() *cobra.Command {
	var socket, configPath, rawPath, valuePath, dtype, shape, requestID string
	cmd := &cobra.Command{
		Use:   "get --config FILE --raw FILE --value FILE --dtype D --shape A,B",
		Short: "Get an input's value through the agent, committing --value's bytes if this process must compute it",
		Long: "get prints {\"key\", \"computed\", \"path\", \"sha256\", \"bytes\"}: sha256 is of the tensor data the\n" +
			"agent's hit maps (read without a copy), so several processes can compare what they got.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if socket == "" || configPath == "" || rawPath == "" || valuePath == "" {
				return usagef("--socket, --config, --raw and --value are required")
			}
			dims, err := parseShape(shape)
			if err != nil {
				return err
			}
			cfg, err := os.ReadFile(configPath) // the agent checks it: a bad one is a usage error below
			if err != nil {
				return usagef("%v", err)
			}
			input, err := os.ReadFile(rawPath)
			if err != nil {
				return usagef("%v", err)
			}
			ctx := cmd.Context()
			c := agent.Dial(socket)
			defer c.Close()
			k, err := c.Key(ctx, agent.KeyRequest{Config: cfg, Mode: "raw-bytes", Data: input})
			if err != nil {
				var apiErr *agent.APIError
				if errors.As(err, &apiErr) && apiErr.Code == "bad_request" {
					return usageError{err}
				}
				return err
			}
			resp, err := c.Lookup(ctx, k.KeyRef, requestID)
			if err != nil {
				return err
			}
			computed := resp.Status == agent.StatusReserved
			if computed {
				value, err := os.ReadFile(valuePath)
				if err != nil {
					c.Abandon(ctx, resp.Reservation, err.Error())
					return err
				}
				if _, err = c.Commit(ctx, resp.Reservation, requestID, dtype, dims, value); err != nil {
					return err
				}
				// The commit is accepted at once; the lookup joins it and
				// answers the value as stored.
				if resp, err = c.Lookup(ctx, k.KeyRef, requestID); err != nil {
					return err
				}
				resp.Path = "computed"
			}
			data, unmap, err := agent.Map(resp.Value)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			unmap()
			c.Release(ctx, requestID)
			return writeJSONLine(cmd.OutOrStdout(), map[string]any{"key": k.Key, "computed": computed,
				"path": resp.Path, "sha256": hex.EncodeToString(sum[:]), "bytes": len(data)})
		},
	}
	f := cmd.Flags()
	f.StringVar(&socket, "socket", envOr("EMBCACHE_AGENT_SOCKET", ""), "the agent's socket ($EMBCACHE_AGENT_SOCKET)")
	f.StringVar(&configPath, "config", "", "preprocessing config (JSON, every field)")
	f.StringVar(&rawPath, "raw", "", "the raw input")
	f.StringVar(&valuePath, "value", "", "tensor bytes to commit when this process computes")
	f.StringVar(&dtype, "dtype", "float32", "the value's dtype")
	f.StringVar(&shape, "shape", "", "the value's shape, comma-separated")
	f.StringVar(&requestID, "request", "go-request", "request id (its pins are released before exit)")
	return cmd
}
