package main

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"

	"github.com/embcache/embcache/cachekey"
	"github.com/spf13/cobra"
)

func newKey() *cobra.Command {
	var configPath, rawPath, tensorPath, tokensPath, dtype, shape string
	var blockSize int
	cmd := &cobra.Command{
		Use:   "key --config FILE (--raw FILE | --tensor FILE --dtype D --shape A,B,.. | --tokens FILE)",
		Short: "Print the content-addressed key of an input",
		Long: "key prints {\"key\": \"<64 hex>\", \"mode\": \"...\"} for an input under a preprocessing config\n" +
			"(a JSON file with the fields of docs/protocol.md section 1). --tokens reads whitespace-separated\n" +
			"token ids. An invalid config or input exits with status 2 and names the field.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return usagef("--config is required")
			}
			raw, err := os.ReadFile(configPath)
			if err != nil {
				return usagef("%v", err)
			}
			var cfg cachekey.PreprocessingConfig
			dec := json.NewDecoder(strings.NewReader(string(raw)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&cfg); err != nil {
				return usagef("config %s: %v", configPath, err)
			}
			keyer, err := cachekey.NewKeyer(cfg)
			if err != nil {
				return usageError{err}
			}
			modes := 0
			for _, p := range []string{rawPath, tensorPath, tokensPath} {
				if p != "" {
					modes++
				}
			}
			if modes != 1 {
				return usagef("give exactly one of --raw, --tensor, --tokens")
			}
			var key cachekey.Key
			var mode cachekey.Mode
			switch {
			case rawPath != "":
				data, err := os.ReadFile(rawPath)
				if err != nil {
					return usagef("%v", err)
				}
				key, err = keyer.RawBytes(data)
				if err != nil {
					return usageError{err}
				}
				mode = cachekey.ModeRawBytes
			case tensorPath != "":
				data, err := os.ReadFile(tensorPath)
				if err != nil {
					return usagef("%v", err)
				}
				d, err := cachekey.ParseDType(dtype)
				if err != nil {
					return usageError{err}
				}
				dims, err := parseShape(shape)
				if err != nil {
					return err
				}
				if key, err = keyer.Tensor(cachekey.Tensor{DType: d, Shape: dims, Data: data}); err != nil {
					return usageError{err}
				}
				mode = cachekey.ModeTensor
			default:
				text, err := os.ReadFile(tokensPath)
				if err != nil {
					return usagef("%v", err)
				}
				var tokens []uint32
				for _, f := range strings.Fields(string(text)) {
					v, err := strconv.ParseUint(f, 10, 32)
					if err != nil {
						return usagef("token %q: %v", f, err)
					}
					tokens = append(tokens, uint32(v))
				}
				if key, err = keyer.Tokens(blockSize, tokens); err != nil {
					return usageError{err}
				}
				mode = cachekey.ModeTokens
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]string{"key": key.String(), "mode": mode.String()})
		},
	}
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "preprocessing config (JSON)")
	f.StringVar(&rawPath, "raw", "", "raw input bytes (a JPEG, a WAV)")
	f.StringVar(&tensorPath, "tensor", "", "decoded tensor: contiguous little-endian bytes")
	f.StringVar(&dtype, "dtype", "", "tensor dtype (float32, bfloat16, uint8, ...)")
	f.StringVar(&shape, "shape", "", "tensor shape, comma-separated")
	f.StringVar(&tokensPath, "tokens", "", "token ids, whitespace-separated")
	f.IntVar(&blockSize, "block-size", cachekey.DefaultTokenBlockSize, "token block size")
	return cmd
}

func parseShape(s string) ([]int64, error) {
	if s == "" {
		return nil, usagef("--shape is required with --tensor")
	}
	var dims []int64
	for _, part := range strings.Split(s, ",") {
		d, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
		if err != nil {
			return nil, usagef("--shape %q: %v", s, err)
		}
		dims = append(dims, d)
	}
	return dims, nil
}
