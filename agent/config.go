package agent

import (
	"fmt"

	"github.com/embcache/embcache/cachekey"
)

// key answers a KeyRequest.
func key(req KeyRequest) (KeyResponse, error) {
	cfg, err := cachekey.DecodeConfig(req.Config)
	if err != nil {
		return KeyResponse{}, err
	}
	keyer, err := cachekey.NewKeyer(cfg)
	if err != nil {
		return KeyResponse{}, err
	}
	var k cachekey.Key
	resp := KeyResponse{Mode: req.Mode}
	switch req.Mode {
	case cachekey.ModeRawBytes.String():
		k, err = keyer.RawBytes(req.Data)
	case cachekey.ModeTensor.String():
		var dt cachekey.DType
		if req.Shape == nil { // absent: never taken for a scalar's, which is []
			err = fmt.Errorf("decoded-tensor needs a shape ([] for a scalar)")
		} else if dt, err = cachekey.ParseDType(req.DType); err == nil {
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
			k, err = keyer.Tokens(bs, req.Tokens)
		}
	default:
		err = fmt.Errorf("mode %q: want %s, %s or %s", req.Mode, cachekey.ModeRawBytes, cachekey.ModeTensor, cachekey.ModeTokens)
	}
	if err != nil {
		return KeyResponse{}, err
	}
	resp.KeyRef = KeyRef{Key: k.String(), Tenant: cfg.Tenant, Model: cfg.ModelID, WeightEpoch: cfg.WeightEpoch}
	return resp, nil
}
