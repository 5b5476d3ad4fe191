package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"strconv"

	"github.com/embcache/embcache/agent"
	"github.com/spf13/cobra"
)

// agentGetFlags are agent get's inputs.
type agentGetFlags struct {
	socket, configPath, rawPath, valuePath, dtype, shape, requestID, agentUID string
	shapeSet                                                                  bool // --shape given: '' is a scalar's shape
}

// newAgentGet is a Go process using the agent as the Python client does:
// look an input up, and if this process must compute, commit a file's bytes.
func newAgentGet() *cobra.Command {
	var g agentGetFlags
	cmd := &cobra.Command{
		Use:   "get --config FILE --raw FILE --value FILE --dtype D --shape A,B",
		Short: "Get an input's value through the agent, committing --value's bytes if this process must compute it",
		Long: "get prints {\"key\", \"computed\", \"path\", \"sha256\", \"bytes\"}: sha256 is of the tensor data the\n" +
			"agent's hit maps (read without a copy), so several processes can compare what they got.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g.shapeSet = cmd.Flags().Changed("shape")
			return g.run(cmd.Context(), cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&g.socket, "socket", envOr("EMBCACHE_AGENT_SOCKET", ""), "the agent's socket ($EMBCACHE_AGENT_SOCKET)")
	f.StringVar(&g.configPath, "config", "", "preprocessing config (JSON, every field)")
	f.StringVar(&g.rawPath, "raw", "", "the raw input")
	f.StringVar(&g.valuePath, "value", "", "tensor bytes to commit when this process computes")
	f.StringVar(&g.dtype, "dtype", "float32", "the value's dtype")
	f.StringVar(&g.shape, "shape", "", "the value's shape, comma-separated ('' for a scalar)")
	f.StringVar(&g.requestID, "request", "go-request", "request id (its pins are released before exit)")
	f.StringVar(&g.agentUID, "agent-uid", envOr("EMBCACHE_AGENT_UID", ""),
		"a user the agent may run as besides this process's and root ($EMBCACHE_AGENT_UID): a process of any other user on the socket is refused")
	return cmd
}

func (g *agentGetFlags) run(ctx context.Context, w io.Writer) error {
	if g.socket == "" || g.configPath == "" || g.rawPath == "" || g.valuePath == "" {
		return usagef("--socket, --config, --raw and --value are required")
	}
	dims, err := parseShape(g.shapeSet, g.shape)
	if err != nil {
		return err
	}
	cfg, err := os.ReadFile(g.configPath) // the agent checks it: a bad one is a usage error below
	if err != nil {
		return usagef("%v", err)
	}
	input, err := os.ReadFile(g.rawPath)
	if err != nil {
		return usagef("%v", err)
	}
	var opts []agent.DialOption
	if g.agentUID != "" {
		uid, err := strconv.ParseUint(g.agentUID, 10, 32)
		if err != nil {
			return usagef("--agent-uid (or $EMBCACHE_AGENT_UID) %q: want a numeric user ID", g.agentUID)
		}
		opts = append(opts, agent.WithAgentUID(uint32(uid)))
	}
	c := agent.Dial(g.socket, opts...)
	defer c.Close()
	k, err := c.Key(ctx, agent.KeyRequest{Config: cfg, Mode: "raw-bytes", Data: input})
	if apiErr := (*agent.APIError)(nil); errors.As(err, &apiErr) && apiErr.Code == "bad_request" {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	resp, err := c.Lookup(ctx, k.KeyRef, g.requestID)
	if err != nil {
		return err
	}
	computed := resp.Status == agent.StatusReserved
	if computed {
		if resp, err = g.commit(ctx, c, k.KeyRef, resp.Reservation, dims); err != nil {
			return err
		}
	}
	data, unmap, err := agent.Map(resp.Value)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	unmap()
	c.Release(ctx, g.requestID)
	return writeJSONLine(w, map[string]any{"key": k.Key, "computed": computed,
		"path": resp.Path, "sha256": hex.EncodeToString(sum[:]), "bytes": len(data)})
}

// commit commits --value's bytes under the reservation; the commit is
// accepted at once, and a second lookup joins it and answers the value as
// stored.
func (g *agentGetFlags) commit(ctx context.Context, c *agent.Client, ref agent.KeyRef, res string, dims []int64) (agent.LookupResponse, error) {
	value, err := os.ReadFile(g.valuePath)
	if err != nil {
		c.Abandon(ctx, res, err.Error())
		return agent.LookupResponse{}, err
	}
	if _, err = c.Commit(ctx, res, g.requestID, g.dtype, dims, value); err != nil {
		return agent.LookupResponse{}, err
	}
	resp, err := c.Lookup(ctx, ref, g.requestID)
	resp.Path = "computed"
	return resp, err
}
