package cachekey

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ReadConfig reads a config's JSON text from r (at most MaxConfigBytes)
// and decodes it as DecodeConfig does. Text over the limit is
// ErrInvalidConfig; a failed read is returned as it is.
func ReadConfig(r io.Reader) (PreprocessingConfig, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxConfigBytes+1))
	if err != nil {
		return PreprocessingConfig{}, err
	}
	if len(data) > MaxConfigBytes {
		return PreprocessingConfig{}, fmt.Errorf("%w: a config is at most %d bytes of JSON; this one is longer", ErrInvalidConfig, MaxConfigBytes)
	}
	return DecodeConfig(data)
}

// ReadTokens reads whitespace-separated decimal token ids from r, 4 bytes
// a token (the text is not held). An id that is not a uint32 is
// ErrInvalidInput naming it.
func ReadTokens(r io.Reader) ([]uint32, error) {
	var tokens []uint32
	words := bufio.NewScanner(r)
	words.Split(bufio.ScanWords)
	for words.Scan() {
		v, err := strconv.ParseUint(words.Text(), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: token %q: %w", ErrInvalidInput, words.Text(), err)
		}
		tokens = append(tokens, uint32(v))
	}
	return tokens, words.Err()
}

// ParseShape parses a tensor shape written "A,B,...": the empty string is
// a scalar's shape (no dimensions), so "" and "1" are two tensors. A
// dimension that is not an integer is ErrInvalidInput; the dimensions'
// ranges are checked where the shape is used (Tensor.Validate). Every
// surface (the key command, the agent) parses a shape here, so one
// spelling is one shape on all of them.
func ParseShape(s string) ([]int64, error) {
	dims := []int64{}
	if s == "" {
		return dims, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		d, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: shape %q: %w", ErrInvalidInput, s, err)
		}
		dims = append(dims, d)
	}
	return dims, nil
}
