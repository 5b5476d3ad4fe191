package cachekey

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func configText(t *testing.T, cfg PreprocessingConfig) string {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDecodeConfig: every valid config decodes to itself; each way of
// getting one wrong is refused, naming the field.
func TestDecodeConfig(t *testing.T) {
	for _, cfg := range []PreprocessingConfig{imageConfig(), videoConfig(), audioConfig(), tokensConfig()} {
		got, err := DecodeConfig([]byte(configText(t, cfg)))
		want, _ := NewKeyer(cfg)
		k, kerr := NewKeyer(got)
		if err != nil || kerr != nil || string(k.encoded) != string(want.encoded) {
			t.Fatalf("%v: %+v %v %v", cfg.Modality, got, err, kerr)
		}
	}
	good := configText(t, imageConfig())
	edit := func(old, new string) string {
		if !strings.Contains(good, old) {
			t.Fatalf("%q not in %s", old, good)
		}
		return strings.Replace(good, old, new, 1)
	}
	for _, tc := range []struct{ name, text, field string }{
		{"missing", edit(`"weight_epoch":0,`, ""), "weight_epoch"},
		{"missing audio", edit(`"audio_sample_rate":0,`, ""), "audio_sample_rate"},
		{"case", edit(`"model_id"`, `"MODEL_ID"`), "MODEL_ID"},
		{"unknown", edit(`{`, `{"colour":"red",`), "colour"},
		{"twice", edit(`{`, `{"tenant":"other",`), "tenant"},
		{"trailing", good + ` {}`, "after the config object"},
		{"trailing junk", good + `x`, "after the config object"},
		{"image_size of 3", edit(`"image_size":[448,448]`, `"image_size":[448,448,3]`), "image_size"},
		{"image_size of 1", edit(`"image_size":[448,448]`, `"image_size":[448]`), "image_size"},
		{"null list", edit(`"normalize_mean":[0.48145466,0.4578275,0.40821073]`, `"normalize_mean":null`), "normalize_mean"}, // then empty: std has 3
		{"null string", edit(`"crop_mode":"center"`, `"crop_mode":null`), "crop_mode"},
		{"float int", edit(`"cache_schema_version":1`, `"cache_schema_version":1.0`), "cache_schema_version"},
		{"string int", edit(`"video_frame_stride":0`, `"video_frame_stride":"0"`), "video_frame_stride"},
		{"negative epoch", edit(`"weight_epoch":0`, `"weight_epoch":-1`), "weight_epoch"},
		{"number string", edit(`"model_id":"Qwen/Qwen2.5-Omni-7B"`, `"model_id":7`), "model_id"},
		{"not an object", `[1,2]`, "object"},
		{"too big", `{"model_id":"` + strings.Repeat("x", MaxConfigBytes) + `"}`, "bytes of JSON"},
		// Each decoded to U+FFFD, the same key as any other.
		{"not UTF-8", edit(`"model_id":"Qwen/`, "\"model_id\":\"Qwen\xff/"), "model_id"},
		{"lone low surrogate", edit(`"model_id":"Qwen/`, `"model_id":"Qwen\udce9/`), "model_id"},
		{"lone high surrogate", edit(`"model_id":"Qwen/`, `"model_id":"Qwen\ud83d/`), "model_id"},
		{"high surrogate at the end", edit(`"crop_mode":"center"`, `"crop_mode":"center\ud83d"`), "crop_mode"},
		{"string sizes", edit(`"image_size":[448,448]`, `"image_size":["448","448"]`), "image_size"},
		{"string mean", edit(`"normalize_mean":[0.48145466,`, `"normalize_mean":["0.48145466",`), "normalize_mean"},
		{"bool mean", edit(`"normalize_mean":[0.48145466,`, `"normalize_mean":[true,`), "normalize_mean"},
		{"high then not low", edit(`"model_id":"Qwen/`, `"model_id":"Qwen\ud83d\u0041/`), "model_id"},
	} {
		_, err := DecodeConfig([]byte(tc.text))
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want ErrInvalidConfig naming %s", tc.name, err, tc.field)
		}
	}
}

// TestDecodeConfigText: a string's escapes and a surrogate pair decode to
// the text they spell, the key of the same config given in Go; a config
// given in Go with a string that is not UTF-8 is refused, as its JSON is.
func TestDecodeConfigText(t *testing.T) {
	want := imageConfig()
	want.ModelID = "Qwen/caf\u00e9-\U0001F600\ufffd"
	good := configText(t, imageConfig())
	text := strings.Replace(good, `"model_id":"Qwen/Qwen2.5-Omni-7B"`, `"model_id":"Qwen\/caf\u00e9-\ud83d\ude00\ufffd"`, 1)
	got, err := DecodeConfig([]byte(text))
	if err != nil || got.ModelID != want.ModelID {
		t.Fatalf("%q %v, want %q", got.ModelID, err, want.ModelID)
	}
	spaced := strings.Replace(good, `"image_size":[448,448]`, `"image_size":[ 448 , 448 ]`, 1)
	if _, err := DecodeConfig([]byte(spaced)); err != nil {
		t.Fatalf("spaces in a list: %v", err)
	}
	bad := imageConfig()
	bad.ModelID = "Qwen\xff"
	if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "model_id") {
		t.Fatalf("Validate of a model_id that is not UTF-8: %v", err)
	}
}

// TestDecodeConfigEveryField: the decoder knows every field of the struct
// (a field added without a decoder is refused, never keyed as zero).
func TestDecodeConfigEveryField(t *testing.T) {
	for i := range reflect.TypeFor[PreprocessingConfig]().NumField() {
		var cfg PreprocessingConfig
		v := reflect.ValueOf(&cfg).Elem().Field(i)
		sample := map[reflect.Kind]string{reflect.String: `"x"`, reflect.Int64: `1`, reflect.Uint64: `1`,
			reflect.Array: `[1,2]`, reflect.Slice: `[0.5]`, reflect.Uint8: `"image"`}[v.Kind()]
		if err := decodeField(v, json.RawMessage(sample)); err != nil {
			t.Errorf("field %d (%s): %v", i, configFieldOrder[i], err)
		}
	}
}

// TestTheLargestConfigDecodes: a valid config of every string at
// MaxStringLen, each byte one that encoding/json escapes to six, and full
// lists decodes from what json.Marshal writes of it (at 96 KiB such a
// config was refused).
func TestTheLargestConfigDecodes(t *testing.T) {
	cfg := imageConfig()
	v := reflect.ValueOf(&cfg).Elem()
	long := 0
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() != reflect.String {
			continue
		}
		was := f.String()
		f.SetString(strings.Repeat("&", MaxStringLen))
		if cfg.Validate() != nil { // a field of fixed values (modality, tenant, dtype)
			f.SetString(was)
			continue
		}
		long++
	}
	cfg.NormalizeMean = slices.Repeat([]float64{-1.2345678901234567e-300}, 64)
	cfg.NormalizeStd = slices.Repeat([]float64{-1.2345678901234567e-300}, 64)
	if err := cfg.Validate(); err != nil || long < 6 {
		t.Fatalf("%v (%d long strings)", err, long)
	}
	text, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeConfig(text)
	if err != nil {
		t.Fatalf("%d bytes: %v", len(text), err)
	}
	want, err1 := FromRawBytes(cfg, nil)
	key, err2 := FromRawBytes(got, nil)
	if err1 != nil || err2 != nil || key != want {
		t.Fatalf("decoded to another key: %v %v", err1, err2)
	}
	t.Logf("%d long strings, %d bytes of JSON", long, len(text))
}
