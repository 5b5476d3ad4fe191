package cachekey

import (
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/vectors.json from the current implementation")

const vectorsPath = "testdata/vectors.json"

// vector is one golden vector: docs/protocol.md section 1 explains how to
// recompute Key (and PrefixKeys) from Config and the input.
type vector struct {
	Name       string              `json:"name"`
	Mode       string              `json:"mode"`
	Config     PreprocessingConfig `json:"config"`
	InputHex   string              `json:"input_hex,omitempty"`
	DType      string              `json:"dtype,omitempty"`
	Shape      []int64             `json:"shape,omitzero"` // [] (a scalar's) is written; nil is not
	Tokens     []uint32            `json:"tokens,omitempty"`
	BlockSize  int                 `json:"block_size,omitempty"`
	PrefixKeys []string            `json:"prefix_keys,omitempty"`
	Key        string              `json:"key"`
}

func vectorInputs() []vector {
	seq := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*31 + 7)
		}
		return b
	}
	tenantB := imageConfig()
	tenantB.Tenant = "other-tenant"
	epoch := imageConfig()
	epoch.WeightEpoch = 3
	tokens := make([]uint32, 37)
	for i := range tokens {
		tokens[i] = uint32(i*1009) ^ 0xbeef
	}
	return []vector{
		{Name: "image raw empty input", Mode: "raw-bytes", Config: imageConfig(), InputHex: ""},
		{Name: "image raw", Mode: "raw-bytes", Config: imageConfig(), InputHex: hex.EncodeToString(seq(100))},
		{Name: "image raw other tenant", Mode: "raw-bytes", Config: tenantB, InputHex: hex.EncodeToString(seq(100))},
		{Name: "image raw weight epoch 3", Mode: "raw-bytes", Config: epoch, InputHex: hex.EncodeToString(seq(100))},
		{Name: "image raw 2 KiB", Mode: "raw-bytes", Config: imageConfig(), InputHex: hex.EncodeToString(seq(2048))},
		{Name: "video raw", Mode: "raw-bytes", Config: videoConfig(), InputHex: hex.EncodeToString(seq(64))},
		{Name: "audio raw", Mode: "raw-bytes", Config: audioConfig(), InputHex: hex.EncodeToString(seq(64))},
		{Name: "image tensor float32 [2,3]", Mode: "decoded-tensor", Config: imageConfig(), DType: "float32", Shape: []int64{2, 3}, InputHex: hex.EncodeToString(seq(24))},
		{Name: "image tensor float32 [3,2]", Mode: "decoded-tensor", Config: imageConfig(), DType: "float32", Shape: []int64{3, 2}, InputHex: hex.EncodeToString(seq(24))},
		{Name: "image tensor float32 scalar []", Mode: "decoded-tensor", Config: imageConfig(), DType: "float32", Shape: []int64{}, InputHex: hex.EncodeToString(seq(4))},
		{Name: "image tensor float32 [1]", Mode: "decoded-tensor", Config: imageConfig(), DType: "float32", Shape: []int64{1}, InputHex: hex.EncodeToString(seq(4))},
		{Name: "audio tensor bfloat16 [1,12]", Mode: "decoded-tensor", Config: audioConfig(), DType: "bfloat16", Shape: []int64{1, 12}, InputHex: hex.EncodeToString(seq(24))},
		{Name: "tokens 37 in blocks of 16", Mode: "tokens", Config: tokensConfig(), Tokens: tokens, BlockSize: 16},
		{Name: "tokens 3 in blocks of 16", Mode: "tokens", Config: tokensConfig(), Tokens: tokens[:3], BlockSize: 16},
	}
}

func (v *vector) compute(t *testing.T) (Key, []Key) {
	t.Helper()
	k, err := NewKeyer(v.Config)
	if err != nil {
		t.Fatalf("%s: %v", v.Name, err)
	}
	input, err := hex.DecodeString(v.InputHex)
	if err != nil {
		t.Fatalf("%s: input_hex: %v", v.Name, err)
	}
	var key Key
	var prefixes []Key
	switch v.Mode {
	case "raw-bytes":
		key, err = k.RawBytes(input)
	case "decoded-tensor":
		var d DType
		if d, err = ParseDType(v.DType); err == nil {
			key, err = k.Tensor(Tensor{DType: d, Shape: v.Shape, Data: input})
		}
	case "tokens":
		if key, err = k.Tokens(v.BlockSize, v.Tokens); err == nil {
			prefixes, err = k.TokenPrefixKeys(v.BlockSize, v.Tokens)
		}
	default:
		t.Fatalf("%s: unknown mode %q", v.Name, v.Mode)
	}
	if err != nil {
		t.Fatalf("%s: %v", v.Name, err)
	}
	return key, prefixes
}

func TestGoldenVectors(t *testing.T) {
	if *update {
		vs := vectorInputs()
		for i := range vs {
			key, prefixes := vs[i].compute(t)
			vs[i].Key = key.String()
			for _, p := range prefixes {
				vs[i].PrefixKeys = append(vs[i].PrefixKeys, p.String())
			}
		}
		out, err := json.MarshalIndent(map[string]any{"version": 1, "vectors": vs}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vectorsPath, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatalf("%v (regenerate with go test ./cachekey -run TestGoldenVectors -update)", err)
	}
	var file struct {
		Vectors []vector `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	modes := map[string]int{}
	for _, v := range file.Vectors {
		key, prefixes := v.compute(t)
		if key.String() != v.Key {
			t.Errorf("%s: key %v, golden %s", v.Name, key, v.Key)
		}
		if len(prefixes) != len(v.PrefixKeys) {
			t.Errorf("%s: %d prefix keys, golden %d", v.Name, len(prefixes), len(v.PrefixKeys))
		}
		for i := range min(len(prefixes), len(v.PrefixKeys)) {
			if prefixes[i].String() != v.PrefixKeys[i] {
				t.Errorf("%s: prefix key %d is %v, golden %s", v.Name, i, prefixes[i], v.PrefixKeys[i])
			}
		}
		modes[v.Mode]++
	}
	for _, m := range []string{"raw-bytes", "decoded-tensor", "tokens"} {
		if modes[m] == 0 {
			t.Errorf("no golden vector for mode %s", m)
		}
	}
}
