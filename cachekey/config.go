package cachekey

import (
	"fmt"
	"math"
	"unicode/utf8"
)

// Modality is the kind of input an encoder consumes.
type Modality uint8

// Modalities. The zero value is invalid so that a config must name one.
const (
	ModalityImage Modality = iota + 1
	ModalityVideo
	ModalityAudio
	ModalityTokens
)

var modalityNames = [...]string{"", "image", "video", "audio", "tokens"}

// String returns the modality's wire name ("image", "video", "audio", "tokens").
func (m Modality) String() string {
	if int(m) < len(modalityNames) && m != 0 {
		return modalityNames[m]
	}
	return fmt.Sprintf("Modality(%d)", uint8(m))
}

// ParseModality is the inverse of String.
func ParseModality(s string) (Modality, error) {
	for i, name := range modalityNames {
		if i != 0 && name == s {
			return Modality(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown modality %q", ErrInvalidConfig, s)
}

// MarshalText implements encoding.TextMarshaler.
func (m Modality) MarshalText() ([]byte, error) {
	if m == 0 || int(m) >= len(modalityNames) {
		return nil, fmt.Errorf("%w: unknown modality %d", ErrInvalidConfig, uint8(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *Modality) UnmarshalText(b []byte) error {
	v, err := ParseModality(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// PreprocessingConfig is every parameter that changes what the encoder
// produces for a given input: the RFC's EncoderPreprocessingConfig plus the
// modality, the weight epoch and the tenant. All of it is hashed into the key.
//
// The field order here is the canonical order of docs/protocol.md; each field
// carries its wire number in the `key` tag. A field added here without being
// hashed fails TestEveryFieldChangesKey.
type PreprocessingConfig struct {
	CacheSchemaVersion int64  `json:"cache_schema_version" key:"1"`
	ModelID            string `json:"model_id" key:"2"`
	ModelRevision      string `json:"model_revision" key:"3"`
	EncoderConfigHash  string `json:"encoder_config_hash" key:"4"`
	ProcessorVersion   string `json:"processor_version" key:"5"`

	// Image and video preprocessing; empty for audio and tokens.
	ResizeMode    string    `json:"resize_mode" key:"6"`
	ImageSize     [2]int64  `json:"image_size" key:"7"` // width, height
	CropMode      string    `json:"crop_mode" key:"8"`
	NormalizeMean []float64 `json:"normalize_mean" key:"9"`
	NormalizeStd  []float64 `json:"normalize_std" key:"10"`

	// Audio and codec tokens; empty for image and video.
	AudioSampleRate      int64  `json:"audio_sample_rate" key:"11"`
	AudioCodecVersion    string `json:"audio_codec_version" key:"12"`
	AudioCodecConfigHash string `json:"audio_codec_config_hash" key:"13"`

	// Video only; 0 otherwise.
	VideoFrameStride int64 `json:"video_frame_stride" key:"14"`

	InputDType string `json:"input_dtype" key:"15"`

	Modality Modality `json:"modality" key:"16"`
	// WeightEpoch is bumped when the encoder's weights change in place, so
	// that embeddings computed with the old weights stop matching.
	WeightEpoch uint64 `json:"weight_epoch" key:"17"`
	// Tenant isolates namespaces: two tenants never share a key. It is also
	// a NATS subject token, so it is limited to [A-Za-z0-9_-], 1-64 bytes.
	Tenant string `json:"tenant" key:"18"`
}

// MaxStringLen bounds every string field, so a config can never be used to
// smuggle an input into the key header.
const MaxStringLen = 4096

// Validate reports whether c can be keyed. Fields that matter for the
// modality must be set; the others must hold their empty value (zero, "" or
// an empty list), so that one logical config has exactly one encoding.
// The error wraps ErrInvalidConfig and names the field.
func (c *PreprocessingConfig) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	if c.CacheSchemaVersion < 1 {
		return bad("cache_schema_version", "must be >= 1, got %d", c.CacheSchemaVersion)
	}
	if err := ValidateTenant(c.Tenant); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{
		{"model_id", c.ModelID}, {"model_revision", c.ModelRevision},
		{"encoder_config_hash", c.EncoderConfigHash}, {"processor_version", c.ProcessorVersion},
		{"input_dtype", c.InputDType},
	} {
		if f.v == "" {
			return bad(f.name, "must be set")
		}
	}
	for _, f := range []struct{ name, v string }{
		{"model_id", c.ModelID}, {"model_revision", c.ModelRevision},
		{"encoder_config_hash", c.EncoderConfigHash}, {"processor_version", c.ProcessorVersion},
		{"resize_mode", c.ResizeMode}, {"crop_mode", c.CropMode},
		{"audio_codec_version", c.AudioCodecVersion}, {"audio_codec_config_hash", c.AudioCodecConfigHash},
		{"input_dtype", c.InputDType},
	} {
		if len(f.v) > MaxStringLen {
			return bad(f.name, "longer than %d bytes", MaxStringLen)
		}
		if !utf8.ValidString(f.v) {
			// JSON cannot carry it: the same config would key otherwise
			// through DecodeConfig (which refuses it) than here.
			return bad(f.name, "not valid UTF-8")
		}
	}
	for _, f := range []struct {
		name string
		v    []float64
	}{{"normalize_mean", c.NormalizeMean}, {"normalize_std", c.NormalizeStd}} {
		for i, x := range f.v {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return bad(f.name, "element %d is %v", i, x)
			}
		}
		if len(f.v) > 64 {
			return bad(f.name, "%d elements, at most 64", len(f.v))
		}
	}

	visual := c.Modality == ModalityImage || c.Modality == ModalityVideo
	audible := c.Modality == ModalityAudio || c.Modality == ModalityTokens
	switch {
	case visual:
		if c.ResizeMode == "" {
			return bad("resize_mode", "must be set for %v", c.Modality)
		}
		if c.ImageSize[0] <= 0 || c.ImageSize[1] <= 0 {
			return bad("image_size", "must be positive for %v, got %v", c.Modality, c.ImageSize)
		}
		if c.CropMode == "" {
			return bad("crop_mode", "must be set for %v", c.Modality)
		}
		if len(c.NormalizeMean) == 0 || len(c.NormalizeMean) != len(c.NormalizeStd) {
			return bad("normalize_mean", "needs one value per channel and as many as normalize_std (%d vs %d)",
				len(c.NormalizeMean), len(c.NormalizeStd))
		}
		for i, s := range c.NormalizeStd {
			if s == 0 {
				return bad("normalize_std", "element %d is 0", i)
			}
		}
		if c.AudioSampleRate != 0 || c.AudioCodecVersion != "" || c.AudioCodecConfigHash != "" {
			return bad("audio_*", "must be empty for %v", c.Modality)
		}
	case audible:
		if c.AudioCodecVersion == "" {
			return bad("audio_codec_version", "must be set for %v", c.Modality)
		}
		if c.AudioCodecConfigHash == "" {
			return bad("audio_codec_config_hash", "must be set for %v", c.Modality)
		}
		if c.Modality == ModalityAudio && c.AudioSampleRate <= 0 {
			return bad("audio_sample_rate", "must be positive for audio, got %d", c.AudioSampleRate)
		}
		if c.AudioSampleRate < 0 {
			return bad("audio_sample_rate", "must not be negative, got %d", c.AudioSampleRate)
		}
		if c.ResizeMode != "" || c.ImageSize != [2]int64{} || c.CropMode != "" ||
			len(c.NormalizeMean) != 0 || len(c.NormalizeStd) != 0 {
			return bad("image_*", "resize_mode, image_size, crop_mode and normalize_* must be empty for %v", c.Modality)
		}
	default:
		return bad("modality", "unknown modality %d", uint8(c.Modality))
	}
	if c.Modality == ModalityVideo {
		if c.VideoFrameStride < 1 {
			return bad("video_frame_stride", "must be >= 1 for video, got %d", c.VideoFrameStride)
		}
	} else if c.VideoFrameStride != 0 {
		return bad("video_frame_stride", "must be 0 for %v", c.Modality)
	}
	return nil
}

// ValidateTenant reports whether t can name a tenant: 1-64 bytes of
// [A-Za-z0-9_-]. Tenants are NATS subject tokens, so '.', '*', '>' and
// spaces are refused here rather than found later in a subject.
func ValidateTenant(t string) error {
	if t == "" || len(t) > 64 {
		return fmt.Errorf("%w: tenant: must be 1-64 bytes, got %d", ErrInvalidConfig, len(t))
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: tenant: byte %d is %q, want [A-Za-z0-9_-]", ErrInvalidConfig, i, c)
		}
	}
	return nil
}
