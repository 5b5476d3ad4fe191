package agent

import (
	"fmt"
	"net/http"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/embcache/embcache/cachekey"
)

// keyers are the Keyers of the configs seen last, by their JSON text: a
// stage sends the same config with every input, and decoding and checking
// it again would cost more than hashing a small input.
func (s *Server) keyerOf(config string) (*cachekey.Keyer, error) {
	if k, ok := s.keyers.Get(config); ok {
		return k, nil
	}
	cfg, err := cachekey.DecodeConfig([]byte(config))
	if err != nil {
		return nil, err
	}
	k, err := cachekey.NewKeyer(cfg)
	if err != nil {
		return nil, err
	}
	s.keyers.Add(config, k)
	return k, nil
}

// keyBytesParams are the parameters of each mode of /v1/key/bytes, beside
// mode, slot and length.
var keyBytesParams = map[string][]string{
	cachekey.ModeRawBytes.String(): nil,
	cachekey.ModeTensor.String():   {"dtype", "shape"},
}

// handleKeyBytes answers POST /v1/key/bytes?mode=raw-bytes (or
// mode=decoded-tensor&dtype=D&shape=A,B,...): the key of the body's bytes
// under the config in ConfigHeader. The body is streamed through BLAKE3 as
// it arrives, in bounded memory whatever its size: no base64, no JSON. With
// &slot=NAME&length=N the input is instead the first N bytes of the
// connection's key slot (POST /v1/key/slot), hashed where it lies: one copy
// in all (the client's into shared memory), where a body costs two through
// the kernel.
func (s *Server) handleKeyBytes(w http.ResponseWriter, r *http.Request) {
	bad := func(format string, args ...any) {
		s.fail(w, fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...)))
	}
	// Each name is given once, and only the mode's: a second config header
	// or shape= was ignored (the first won), and a misspelt Shape= left the
	// tensor keyed as a scalar.
	if n := len(r.Header.Values(ConfigHeader)); n > 1 {
		bad("the %s header is given %d times", ConfigHeader, n)
		return
	}
	q := r.URL.Query()
	mode := q.Get("mode")
	params, knownMode := keyBytesParams[mode]
	for name, vs := range q {
		switch {
		case len(vs) > 1:
			bad("parameter %q is given %d times", name, len(vs))
			return
		case knownMode && !slices.Contains(params, name) && name != "mode" && name != "slot" && name != "length":
			bad("parameter %q: mode %s takes %s", name, mode, strings.Join(slices.Concat(params, []string{"slot", "length"}), ", "))
			return
		}
	}
	config := r.Header.Get(ConfigHeader)
	if config == "" {
		bad("the %s header (the preprocessing config, a JSON object) is required", ConfigHeader)
		return
	}
	keyer, err := s.keyerOf(config)
	if err != nil {
		bad("%v", err)
		return
	}
	// The input is the body, or the first length bytes of the connection's
	// key slot (a shared-memory file the client wrote it into).
	var input []byte
	fromSlot := q.Has("slot")
	if fromSlot {
		var release func()
		if input, release, err = sessionOf(r).keySlotBytes(q.Get("slot"), q.Get("length")); err != nil {
			bad("%v", err)
			return
		}
		defer release()
	}
	var k cachekey.Key
	switch mode {
	case cachekey.ModeRawBytes.String():
		if fromSlot {
			err = guardFaults(func() { k, err = keyer.RawBytes(input) })
		} else {
			k, err = keyer.RawBytesFrom(r.Body)
		}
	case cachekey.ModeTensor.String():
		var dt cachekey.DType
		var shape []int64
		if dt, err = cachekey.ParseDType(q.Get("dtype")); err != nil {
			bad("dtype: %v", err)
			return
		}
		if !q.Has("shape") {
			bad("shape is required (shape=A,B,...; shape= for a scalar)")
			return
		}
		if shape, err = cachekey.ParseShape(q.Get("shape")); err != nil {
			bad("%v", err)
			return
		}
		if fromSlot {
			err = guardFaults(func() { k, err = keyer.Tensor(cachekey.Tensor{DType: dt, Shape: shape, Data: input}) })
		} else {
			k, err = keyer.TensorFrom(dt, shape, r.Body)
		}
	default:
		bad("mode %q: want %s or %s (tokens are keyed by POST /v1/key)", mode, cachekey.ModeRawBytes, cachekey.ModeTensor)
		return
	}
	if err != nil {
		bad("%v", err)
		return
	}
	cfg := keyer.Config()
	s.keyed(cfg, k)
	reply(w, KeyResponse{Mode: mode, KeyRef: KeyRef{Key: k.String(), Tenant: cfg.Tenant, Model: cfg.ModelID, WeightEpoch: cfg.WeightEpoch}})
}

// handleKeySlot answers POST /v1/key/slot {"size"}: a shared-memory file of
// size bytes for this connection's key inputs, replacing its previous one.
// It lives as long as the connection.
func (s *Server) handleKeySlot(w http.ResponseWriter, r *http.Request) {
	var req KeySlotRequest
	if !s.decode(w, r, &req) {
		return
	}
	if req.Size <= 0 || req.Size > s.maxBody {
		s.fail(w, fmt.Errorf("%w: key slot size %d out of [1, %d]", ErrBadRequest, req.Size, s.maxBody))
		return
	}
	name := randomID()
	path := filepath.Join(s.slotDir, "key-"+name)
	m, err := createKeySlot(path, req.Size, s.group)
	if err != nil {
		s.fail(w, fmt.Errorf("agent: creating key slot: %w", err)) // no_space: the client sends the body instead
		return
	}
	if !sessionOf(r).setKeySlot(name, m) {
		m.close()
		s.fail(w, fmt.Errorf("%w: its connection closed", ErrReservationEnded))
		return
	}
	reply(w, SlotResponse{Slot: name, File: path, Size: req.Size})
}

// guardFaults runs fn, which reads a mapping of a file a client can write:
// if the client truncated the file under it, the read faults (SIGBUS), and
// that is an error for this call, not the end of the agent.
func guardFaults(fn func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the key slot's file was cut short while it was read: %v", r)
		}
	}()
	fn()
	return nil
}
