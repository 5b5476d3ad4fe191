package main

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"slices"

	"github.com/embcache/embcache/cachekey"
	"github.com/spf13/cobra"
)

// keyFlags are the key command's inputs.
type keyFlags struct {
	configPath, rawPath, tensorPath, tokensPath, dtype, shape string
	blockSize                                                 int
	shapeSet                                                  bool // --shape given: "" is a scalar's shape, not a missing flag
}

func newKey() *cobra.Command {
	var f keyFlags
	cmd := &cobra.Command{
		Use:   "key --config FILE (--raw FILE | --tensor FILE --dtype D --shape A,B,.. | --tokens FILE)",
		Short: "Print the content-addressed key of an input",
		Long: "key prints {\"key\": \"<64 hex>\", \"mode\": \"...\"} for an input under a preprocessing config\n" +
			"(a JSON file with every field of docs/protocol.md section 1, under its exact name, once; at most\n" +
			"256 KiB). --raw and --tensor are read as a stream through BLAKE3: memory stays under a few MiB\n" +
			"whatever the input's size (a file, a pipe, /dev/stdin). --tokens reads whitespace-separated token\n" +
			"ids. An invalid config or input exits with status 2 and names the field.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.shapeSet = cmd.Flags().Changed("shape")
			key, mode, err := f.key()
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]string{"key": key.String(), "mode": mode.String()})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.configPath, "config", "", "preprocessing config (JSON)")
	fs.StringVar(&f.rawPath, "raw", "", "raw input bytes (a JPEG, a WAV)")
	fs.StringVar(&f.tensorPath, "tensor", "", "decoded tensor: contiguous little-endian bytes")
	fs.StringVar(&f.dtype, "dtype", "", "tensor dtype (float32, bfloat16, uint8, ...)")
	fs.StringVar(&f.shape, "shape", "", "tensor shape, comma-separated ('' for a scalar)")
	fs.StringVar(&f.tokensPath, "tokens", "", "token ids, whitespace-separated")
	fs.IntVar(&f.blockSize, "block-size", cachekey.DefaultTokenBlockSize, "token block size")
	return cmd
}

// key reads the config and the one input the flags name, and keys it.
func (f *keyFlags) key() (cachekey.Key, cachekey.Mode, error) {
	if f.configPath == "" {
		return cachekey.Key{}, 0, usagef("--config is required")
	}
	cfg, err := readConfig(f.configPath)
	if err != nil {
		return cachekey.Key{}, 0, err
	}
	keyer, err := cachekey.NewKeyer(cfg)
	if err != nil {
		return cachekey.Key{}, 0, usageError{err}
	}
	if len(slices.DeleteFunc([]string{f.rawPath, f.tensorPath, f.tokensPath}, func(p string) bool { return p == "" })) != 1 {
		return cachekey.Key{}, 0, usagef("give exactly one of --raw, --tensor, --tokens")
	}
	switch {
	case f.rawPath != "":
		key, err := keyFile(f.rawPath, keyer.RawBytesFrom)
		return key, cachekey.ModeRawBytes, err
	case f.tensorPath != "":
		d, err := cachekey.ParseDType(f.dtype)
		if err != nil {
			return cachekey.Key{}, 0, usageError{err}
		}
		dims, err := parseShape(f.shapeSet, f.shape)
		if err != nil {
			return cachekey.Key{}, 0, err
		}
		key, err := keyFile(f.tensorPath, func(r io.Reader) (cachekey.Key, error) { return keyer.TensorFrom(d, dims, r) })
		return key, cachekey.ModeTensor, err
	}
	var tokens []uint32
	if _, err := keyFile(f.tokensPath, func(r io.Reader) (k cachekey.Key, err error) {
		tokens, err = cachekey.ReadTokens(r)
		return k, err
	}); err != nil {
		return cachekey.Key{}, 0, err
	}
	key, err := keyer.Tokens(f.blockSize, tokens)
	if err != nil {
		return cachekey.Key{}, 0, usageError{err}
	}
	return key, cachekey.ModeTokens, nil
}

// keyFile keys the stream of the file at path.
func keyFile(path string, key func(io.Reader) (cachekey.Key, error)) (cachekey.Key, error) {
	f, err := os.Open(path)
	if err != nil {
		return cachekey.Key{}, usagef("%v", err)
	}
	defer f.Close()
	k, err := key(f)
	if err != nil {
		return k, keyInputError(err)
	}
	return k, nil
}

// readConfig reads and decodes the config file at path; anything wrong
// with it is a usage error naming the file.
func readConfig(path string) (cachekey.PreprocessingConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return cachekey.PreprocessingConfig{}, usagef("config %s: %v", path, err)
	}
	defer f.Close()
	cfg, err := cachekey.ReadConfig(f)
	if err != nil {
		return cfg, usagef("config %s: %w", path, err)
	}
	return cfg, nil
}

// parseShape is a --shape flag as dimensions: required (set tells a flag
// not given from the empty string, a scalar's shape), and a usage error if
// malformed.
func parseShape(set bool, s string) ([]int64, error) {
	if !set {
		return nil, usagef("--shape is required (--shape '' for a scalar)")
	}
	dims, err := cachekey.ParseShape(s)
	if err != nil {
		return nil, usageError{err}
	}
	return dims, nil
}

// keyInputError is an input that cannot be keyed (exit 2), or a failed read
// (exit 1).
func keyInputError(err error) error {
	if errors.Is(err, cachekey.ErrInvalidInput) || errors.Is(err, cachekey.ErrInvalidConfig) {
		return usageError{err}
	}
	return err
}
