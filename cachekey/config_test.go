package cachekey

import (
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func imageConfig() PreprocessingConfig {
	return PreprocessingConfig{
		CacheSchemaVersion: 1,
		ModelID:            "Qwen/Qwen2.5-Omni-7B",
		ModelRevision:      "ae9e1690543ffd5c0221dc27f79834d0294cba00",
		EncoderConfigHash:  "b3:vit-l-14",
		ProcessorVersion:   "transformers-4.57.1",
		ResizeMode:         "bicubic",
		ImageSize:          [2]int64{448, 448},
		CropMode:           "center",
		NormalizeMean:      []float64{0.48145466, 0.4578275, 0.40821073},
		NormalizeStd:       []float64{0.26862954, 0.26130258, 0.27577711},
		InputDType:         "bfloat16",
		Modality:           ModalityImage,
		WeightEpoch:        0,
		Tenant:             "acme",
	}
}

func videoConfig() PreprocessingConfig {
	c := imageConfig()
	c.Modality = ModalityVideo
	c.VideoFrameStride = 2
	return c
}

func audioConfig() PreprocessingConfig {
	return PreprocessingConfig{
		CacheSchemaVersion:   1,
		ModelID:              "Qwen/Qwen2.5-Omni-7B",
		ModelRevision:        "ae9e1690543ffd5c0221dc27f79834d0294cba00",
		EncoderConfigHash:    "b3:whisper-enc",
		ProcessorVersion:     "transformers-4.57.1",
		AudioSampleRate:      16000,
		AudioCodecVersion:    "Encodec-24khz-1.0",
		AudioCodecConfigHash: "b3:nq8-6kbps",
		InputDType:           "float32",
		Modality:             ModalityAudio,
		Tenant:               "acme",
	}
}

func tokensConfig() PreprocessingConfig {
	c := audioConfig()
	c.Modality = ModalityTokens
	c.AudioCodecVersion = "ChatTTS-DVAE-v2"
	return c
}

// keyOf keys a fixed input in the config's natural mode.
func keyOf(t *testing.T, c PreprocessingConfig) (Key, error) {
	t.Helper()
	if c.Modality == ModalityTokens {
		return FromTokens(c, []uint32{1, 2, 3, 4, 5})
	}
	return FromRawBytes(c, []byte("the same input bytes"))
}

// mutate changes v to another value of its type, keeping it as plausible as
// possible (a non-empty string stays non-empty, a positive number positive).
func mutate(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint64, reflect.Uint8:
		v.SetUint(v.Uint() + 1)
	case reflect.Array:
		mutate(v.Index(0))
	case reflect.Slice:
		if v.Len() == 0 {
			v.Set(reflect.Append(v, reflect.ValueOf(1.5)))
			return
		}
		s := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		reflect.Copy(s, v)
		s.Index(0).SetFloat(s.Index(0).Float() + 0.5)
		v.Set(s)
	default:
		panic("mutate: unhandled kind " + v.Kind().String())
	}
}

// TestEveryFieldChangesKey walks every config field by reflection: for each
// modality, changing the field either makes the config invalid or changes
// the key, and for every field some modality accepts the change. A field
// added to PreprocessingConfig without being hashed fails here.
func TestEveryFieldChangesKey(t *testing.T) {
	typ := reflect.TypeFor[PreprocessingConfig]()
	bases := []PreprocessingConfig{imageConfig(), videoConfig(), audioConfig(), tokensConfig()}
	for i := range typ.NumField() {
		f := typ.Field(i)
		if tag := f.Tag.Get("key"); tag != strconv.Itoa(i+1) {
			t.Errorf("field %s has key tag %q, want %d (canonical order)", f.Name, tag, i+1)
		}
		t.Run(f.Name, func(t *testing.T) {
			changed := 0
			for _, base := range bases {
				before, err := keyOf(t, base)
				if err != nil {
					t.Fatalf("base %v config invalid: %v", base.Modality, err)
				}
				mutated := base
				mutate(reflect.ValueOf(&mutated).Elem().Field(i))
				if err := mutated.Validate(); err != nil {
					if !errors.Is(err, ErrInvalidConfig) {
						t.Errorf("%v: invalid mutation gives %v, want ErrInvalidConfig", base.Modality, err)
					}
					continue
				}
				if string(appendConfig(nil, &mutated)) == string(appendConfig(nil, &base)) {
					t.Errorf("%v: changing %s leaves the canonical config unchanged", base.Modality, f.Name)
				}
				after, err := keyOf(t, mutated)
				if err != nil {
					t.Fatalf("%v: valid config gives no key: %v", base.Modality, err)
				}
				if after == before {
					t.Errorf("%v: changing %s leaves the key unchanged", base.Modality, f.Name)
				}
				changed++
			}
			if changed == 0 {
				t.Errorf("no modality accepts a change of %s, so no test proves it is hashed", f.Name)
			}
		})
	}
}

func TestValidateNamesField(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*PreprocessingConfig)
		field string
	}{
		{"schema", func(c *PreprocessingConfig) { c.CacheSchemaVersion = 0 }, "cache_schema_version"},
		{"model", func(c *PreprocessingConfig) { c.ModelID = "" }, "model_id"},
		{"tenant dot", func(c *PreprocessingConfig) { c.Tenant = "a.b" }, "tenant"},
		{"tenant star", func(c *PreprocessingConfig) { c.Tenant = "*" }, "tenant"},
		{"tenant gt", func(c *PreprocessingConfig) { c.Tenant = ">" }, "tenant"},
		{"tenant space", func(c *PreprocessingConfig) { c.Tenant = "a b" }, "tenant"},
		{"tenant empty", func(c *PreprocessingConfig) { c.Tenant = "" }, "tenant"},
		{"nan", func(c *PreprocessingConfig) { c.NormalizeMean[1] = math.NaN() }, "normalize_mean"},
		{"inf", func(c *PreprocessingConfig) { c.NormalizeStd[0] = math.Inf(1) }, "normalize_std"},
		{"zero std", func(c *PreprocessingConfig) { c.NormalizeStd[0] = 0 }, "normalize_std"},
		{"channels", func(c *PreprocessingConfig) { c.NormalizeStd = c.NormalizeStd[:2] }, "normalize_mean"},
		{"size", func(c *PreprocessingConfig) { c.ImageSize[1] = 0 }, "image_size"},
		{"audio on image", func(c *PreprocessingConfig) { c.AudioCodecVersion = "Encodec" }, "audio_"},
		{"stride on image", func(c *PreprocessingConfig) { c.VideoFrameStride = 1 }, "video_frame_stride"},
		{"modality", func(c *PreprocessingConfig) { c.Modality = 0 }, "modality"},
		{"huge string", func(c *PreprocessingConfig) { c.ModelRevision = strings.Repeat("r", MaxStringLen+1) }, "model_revision"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := imageConfig()
			tc.edit(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig naming %s", err, tc.field)
			}
			if _, err := FromRawBytes(c, []byte("x")); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("FromRawBytes gave a key for an invalid config: %v", err)
			}
		})
	}
	a := audioConfig()
	a.ImageSize = [2]int64{1, 1}
	if err := a.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("audio config with image_size validated: %v", err)
	}
	v := videoConfig()
	v.VideoFrameStride = 0
	if err := v.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("video config without stride validated: %v", err)
	}
}

func TestModalityAndDTypeText(t *testing.T) {
	for m := ModalityImage; m <= ModalityTokens; m++ {
		var back Modality
		b, err := m.MarshalText()
		if err != nil || back.UnmarshalText(b) != nil || back != m {
			t.Fatalf("modality %v does not round-trip: %s %v", m, b, err)
		}
	}
	for d := Float32; d <= Bool; d++ {
		var back DType
		b, err := d.MarshalText()
		if err != nil || back.UnmarshalText(b) != nil || back != d || d.Size() == 0 {
			t.Fatalf("dtype %v does not round-trip: %s %v", d, b, err)
		}
	}
	if _, err := ParseModality("smell"); err == nil {
		t.Fatal("unknown modality parsed")
	}
	if _, err := ParseDType("float128"); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("unknown dtype: %v", err)
	}
	if _, err := Modality(9).MarshalText(); err == nil {
		t.Fatal("invalid modality marshalled")
	}
}
