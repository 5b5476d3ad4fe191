package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/embcache/embcache/cachekey"
)

// configFields are the JSON names of every PreprocessingConfig field.
var configFields = func() []string {
	t := reflect.TypeFor[cachekey.PreprocessingConfig]()
	names := make([]string, 0, t.NumField())
	for f := range t.Fields() {
		names = append(names, strings.Split(f.Tag.Get("json"), ",")[0])
	}
	return names
}()

// decodeConfig decodes a config that names every field, and nothing else.
func decodeConfig(raw json.RawMessage) (cachekey.PreprocessingConfig, error) {
	var cfg cachekey.PreprocessingConfig
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return cfg, fmt.Errorf("config: %w", err)
	}
	var missing, unknown []string
	for _, f := range configFields {
		if _, ok := m[f]; !ok {
			missing = append(missing, f)
		}
	}
	for f := range m {
		if !slices.Contains(configFields, f) {
			unknown = append(unknown, f)
		}
	}
	if len(missing) > 0 || len(unknown) > 0 {
		slices.Sort(unknown)
		return cfg, fmt.Errorf("config: missing fields %v, unknown fields %v (every field is part of the key)", missing, unknown)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("config: %w", err)
	}
	return cfg, cfg.Validate()
}

// key answers a KeyRequest.
func key(req KeyRequest) (KeyResponse, error) {
	cfg, err := decodeConfig(req.Config)
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
