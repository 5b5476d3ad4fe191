package cachekey

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

func mustKeyer(t testing.TB, c PreprocessingConfig) *Keyer {
	t.Helper()
	k, err := NewKeyer(c)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSameInputSameKey(t *testing.T) {
	data := []byte("a jpeg, say")
	a, err := FromRawBytes(imageConfig(), data)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := FromRawBytes(imageConfig(), bytes.Clone(data))
	if a != b || a.IsZero() {
		t.Fatalf("same input, same config: %v vs %v", a, b)
	}
	tensor := Tensor{DType: Float32, Shape: []int64{2, 2}, Data: make([]byte, 16)}
	c, _ := FromTensor(videoConfig(), tensor)
	d, _ := FromTensor(videoConfig(), tensor)
	if c != d {
		t.Fatal("tensor keys differ for the same input")
	}
	e, _ := FromTokens(tokensConfig(), []uint32{7, 8, 9})
	f, _ := FromTokens(tokensConfig(), []uint32{7, 8, 9})
	if e != f {
		t.Fatal("token keys differ for the same input")
	}
}

func TestMovingBytesChangesKey(t *testing.T) {
	keys := map[Key]string{}
	add := func(name string, k Key, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if prev, dup := keys[k]; dup {
			t.Fatalf("%s and %s share key %v", name, prev, k)
		}
		keys[k] = name
	}
	c1, c2 := imageConfig(), imageConfig()
	c1.ModelID, c1.ModelRevision = "ab", "c"
	c2.ModelID, c2.ModelRevision = "a", "bc"
	k1, err := FromRawBytes(c1, []byte("x"))
	add("model ab|c", k1, err)
	k2, err := FromRawBytes(c2, []byte("x"))
	add("model a|bc", k2, err)

	c3, c4 := imageConfig(), imageConfig()
	c3.NormalizeMean, c3.NormalizeStd = []float64{1, 2}, []float64{3, 4}
	c4.NormalizeMean, c4.NormalizeStd = []float64{1, 2}, []float64{4, 3}
	k3, err := FromRawBytes(c3, []byte("x"))
	add("std 3,4", k3, err)
	k4, err := FromRawBytes(c4, []byte("x"))
	add("std 4,3", k4, err)

	data := make([]byte, 24)
	for i := range data {
		data[i] = byte(i)
	}
	for _, tc := range []struct {
		name string
		t    Tensor
	}{
		{"f32 [2,3]", Tensor{Float32, []int64{2, 3}, data}},
		{"f32 [3,2]", Tensor{Float32, []int64{3, 2}, data}},
		{"f32 [6]", Tensor{Float32, []int64{6}, data}},
		{"f32 [1,6]", Tensor{Float32, []int64{1, 6}, data}},
		{"i32 [2,3]", Tensor{Int32, []int64{2, 3}, data}},
		{"bf16 [12]", Tensor{BFloat16, []int64{12}, data}},
		{"f16 [12]", Tensor{Float16, []int64{12}, data}},
		{"u8 [24]", Tensor{Uint8, []int64{24}, data}},
	} {
		k, err := FromTensor(imageConfig(), tc.t)
		add(tc.name, k, err)
	}
	k, err := FromRawBytes(imageConfig(), data)
	add("raw bytes of the same data", k, err)

	// Block boundaries are part of a token key.
	kt := mustKeyer(t, tokensConfig())
	seq := []uint32{1, 2, 3, 4, 5, 6}
	for _, bs := range []int{1, 2, 3, 6} {
		k, err := kt.Tokens(bs, seq)
		add("tokens block "+string(rune('0'+bs)), k, err)
	}
	k, err = kt.Tokens(2, seq[:5])
	add("tokens shorter", k, err)
}

func TestNegativeZeroFolds(t *testing.T) {
	a, b := imageConfig(), imageConfig()
	a.NormalizeMean[0] = 0
	b.NormalizeMean[0] = math.Copysign(0, -1)
	ka, _ := FromRawBytes(a, []byte("x"))
	kb, _ := FromRawBytes(b, []byte("x"))
	if ka != kb {
		t.Fatal("-0 and +0 give different keys")
	}
}

func TestTokenPrefixesCompose(t *testing.T) {
	k := mustKeyer(t, tokensConfig())
	seq := make([]uint32, 50)
	for i := range seq {
		seq[i] = uint32(i * 7)
	}
	prefixes, err := k.TokenPrefixKeys(16, seq)
	if err != nil {
		t.Fatal(err)
	}
	if len(prefixes) != 3 {
		t.Fatalf("%d prefix keys for 50 tokens in blocks of 16, want 3", len(prefixes))
	}
	for i, p := range prefixes {
		whole, err := k.Tokens(16, seq[:(i+1)*16])
		if err != nil || whole != p {
			t.Fatalf("prefix %d: key of the prefix %v != prefix key %v (%v)", i, whole, p, err)
		}
	}
	full, _ := k.Tokens(16, seq)
	if full == prefixes[2] {
		t.Fatal("the trailing partial block is not in the key")
	}
}

func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    Tensor
	}{
		{"short data", Tensor{Float32, []int64{2, 2}, make([]byte, 15)}},
		{"long data", Tensor{Float32, []int64{2, 2}, make([]byte, 17)}},
		{"negative dim", Tensor{Float32, []int64{-2, -2}, make([]byte, 16)}},
		{"unknown dtype", Tensor{0, []int64{4}, make([]byte, 4)}},
		{"overflow", Tensor{Float64, []int64{1 << 40, 1 << 40}, nil}},
		{"rank", Tensor{Uint8, make([]int64, MaxDims+1), nil}},
	} {
		if _, err := FromTensor(imageConfig(), tc.t); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: %v, want ErrInvalidInput", tc.name, err)
		}
	}
	tk := mustKeyer(t, tokensConfig())
	if _, err := tk.Tokens(0, []uint32{1}); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("block size 0: %v", err)
	}
	if _, err := tk.Tokens(16, nil); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("empty tokens: %v", err)
	}
	if _, err := tk.RawBytes([]byte("x")); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("raw bytes on a tokens config: %v", err)
	}
	if _, err := mustKeyer(t, imageConfig()).Tokens(16, []uint32{1}); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("tokens on an image config: %v", err)
	}
}

func TestParse(t *testing.T) {
	k, _ := FromRawBytes(imageConfig(), []byte("x"))
	back, err := Parse(k.String())
	if err != nil || back != k {
		t.Fatalf("Parse(String()) = %v, %v", back, err)
	}
	text, _ := k.MarshalText()
	var viaText Key
	if err := viaText.UnmarshalText(text); err != nil || viaText != k {
		t.Fatalf("text round trip: %v", err)
	}
	s := k.String()
	for _, bad := range []string{"", s[:63], s + "0", "A" + s[1:], "." + s[1:], "*" + s[1:], ">" + s[1:], " " + s[1:], "g" + s[1:]} {
		if _, err := Parse(bad); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("Parse(%q) = %v, want ErrMalformedKey", bad, err)
		}
	}
}
