package agent

import (
	"fmt"

	"github.com/embcache/embcache/cachekey"
)

// key answers a KeyRequest, and remembers the labels of the keys it
// answers (keyed).
func (s *Server) key(req KeyRequest) (KeyResponse, error) {
	cfg, err := cachekey.DecodeConfig(req.Config)
	if err != nil {
		return KeyResponse{}, err
	}
	keyer, err := cachekey.NewKeyer(cfg)
	if err != nil {
		return KeyResponse{}, err
	}
	if err := req.checkFields(); err != nil {
		return KeyResponse{}, err
	}
	var k cachekey.Key
	resp := KeyResponse{Mode: req.Mode}
	switch req.Mode {
	case cachekey.ModeRawBytes.String():
		k, err = keyer.RawBytes(req.Data)
	case cachekey.ModeTensor.String():
		var dt cachekey.DType
		if dt, err = cachekey.ParseDType(req.DType); err == nil {
			k, err = keyer.Tensor(cachekey.Tensor{DType: dt, Shape: req.Shape, Data: req.Data})
		}
	case cachekey.ModeTokens.String():
		bs := req.BlockSize
		if bs == 0 {
			bs = cachekey.DefaultTokenBlockSize
		}
		var prefixes []cachekey.Key
		if prefixes, err = keyer.TokenPrefixKeys(bs, req.Tokens); err == nil {
			for _, p := range prefixes {
				resp.PrefixKeys = append(resp.PrefixKeys, p.String())
			}
			if k, err = keyer.Tokens(bs, req.Tokens); err == nil {
				s.keyed(cfg, prefixes...)
			}
		}
	default:
		err = fmt.Errorf("mode %q: want %s, %s or %s", req.Mode, cachekey.ModeRawBytes, cachekey.ModeTensor, cachekey.ModeTokens)
	}
	if err != nil {
		return KeyResponse{}, err
	}
	s.keyed(cfg, k)
	resp.KeyRef = KeyRef{Key: k.String(), Tenant: cfg.Tenant, Model: cfg.ModelID, WeightEpoch: cfg.WeightEpoch}
	return resp, nil
}

// checkFields refuses a request without the fields its mode keys, or with
// another mode's: an absent data was keyed as the empty input, so every
// call that forgot it shared one key, and a field the mode ignores is a
// caller's mistake, not a part of the key. An empty input is "data": "",
// a scalar's shape [].
func (req KeyRequest) checkFields() error {
	var need, stray []string
	has := map[string]bool{"data": req.Data != nil, "dtype": req.DType != "", "shape": req.Shape != nil,
		"tokens": req.Tokens != nil, "block_size": req.BlockSize != 0}
	switch req.Mode {
	case cachekey.ModeRawBytes.String():
		need, stray = []string{"data"}, []string{"dtype", "shape", "tokens", "block_size"}
	case cachekey.ModeTensor.String():
		need, stray = []string{"data", "dtype", "shape"}, []string{"tokens", "block_size"}
	case cachekey.ModeTokens.String():
		need, stray = []string{"tokens"}, []string{"data", "dtype", "shape"}
	default:
		return nil // the mode itself is refused by the caller
	}
	for _, f := range need {
		if !has[f] {
			return fmt.Errorf("mode %s needs %q (\"data\": \"\" is the empty input, \"shape\": [] a scalar's)", req.Mode, f)
		}
	}
	for _, f := range stray {
		if has[f] {
			return fmt.Errorf("mode %s keys no %q: leave it out", req.Mode, f)
		}
	}
	return nil
}
