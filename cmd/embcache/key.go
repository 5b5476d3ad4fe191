package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
			"(a JSON file with every field of docs/protocol.md section 1, under its exact name, once; at most\n" +
			"96 KiB). --raw and --tensor are read as a stream through BLAKE3: memory stays under a few MiB\n" +
			"whatever the input's size (a file, a pipe, /dev/stdin). --tokens reads whitespace-separated token\n" +
			"ids. An invalid config or input exits with status 2 and names the field.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return usagef("--config is required")
			}
			raw, err := readAtMost(configPath, cachekey.MaxConfigBytes)
			if err != nil {
				return usagef("config %s: %v", configPath, err)
			}
			cfg, err := cachekey.DecodeConfig(raw)
			if err != nil {
				return usagef("config %s: %w", configPath, err)
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
				f, err := os.Open(rawPath)
				if err != nil {
					return usagef("%v", err)
				}
				defer f.Close()
				if key, err = keyer.RawBytesFrom(f); err != nil {
					return keyInputError(err)
				}
				mode = cachekey.ModeRawBytes
			case tensorPath != "":
				d, err := cachekey.ParseDType(dtype)
				if err != nil {
					return usageError{err}
				}
				dims, err := parseShape(shape)
				if err != nil {
					return err
				}
				f, err := os.Open(tensorPath)
				if err != nil {
					return usagef("%v", err)
				}
				defer f.Close()
				if key, err = keyer.TensorFrom(d, dims, f); err != nil {
					return keyInputError(err)
				}
				mode = cachekey.ModeTensor
			default:
				f, err := os.Open(tokensPath)
				if err != nil {
					return usagef("%v", err)
				}
				defer f.Close()
				var tokens []uint32 // 4 bytes a token: the text is not held
				words := bufio.NewScanner(f)
				words.Split(bufio.ScanWords)
				for words.Scan() {
					v, err := strconv.ParseUint(words.Text(), 10, 32)
					if err != nil {
						return usagef("token %q: %v", words.Text(), err)
					}
					tokens = append(tokens, uint32(v))
				}
				if err := words.Err(); err != nil {
					return usagef("%s: %v", tokensPath, err)
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

// readAtMost reads a file of at most limit bytes.
func readAtMost(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > limit {
		return nil, fmt.Errorf("more than %d bytes (a config is at most that)", limit)
	}
	return data, nil
}

// keyInputError is an input that cannot be keyed (exit 2), or a failed read
// (exit 1).
func keyInputError(err error) error {
	if errors.Is(err, cachekey.ErrInvalidInput) || errors.Is(err, cachekey.ErrInvalidConfig) {
		return usageError{err}
	}
	return err
}
