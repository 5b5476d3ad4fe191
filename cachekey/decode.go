package cachekey

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxConfigBytes bounds a config's JSON text. The largest valid config,
// as an encoder writes it, is under it: every string at MaxStringLen of
// bytes that each escape to six (a control byte is \u0001; Go's
// encoding/json writes & < > so too), 64 floats per list. At 96 KiB,
// valid configs that json.Marshal wrote were refused.
const MaxConfigBytes = 256 << 10

// DecodeConfig decodes the JSON text of a config (docs/protocol.md section
// 1.1) strictly, and validates it: every field present, under its exact
// name (no other spelling, no unknown field, none twice), of its JSON type
// (integers exact, image_size exactly [width, height], the normalize lists
// lists, where null is the empty list, as Go writes one, and the only
// field null may stand for), one object and nothing after it, at
// most MaxConfigBytes. A config refused here has no key: one that decoded
// leniently could take another config's key (a silent false hit). The
// error wraps ErrInvalidConfig and names one field.
func DecodeConfig(data []byte) (PreprocessingConfig, error) {
	var cfg PreprocessingConfig
	if len(data) > MaxConfigBytes {
		return cfg, fmt.Errorf("%w: %d bytes of JSON, at most %d", ErrInvalidConfig, len(data), MaxConfigBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return cfg, fmt.Errorf("%w: want a JSON object", ErrInvalidConfig)
	}
	seen := make(map[string]bool, len(configFieldIndex))
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return cfg, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		name := t.(string) // an object's keys are strings
		f, ok := configFieldIndex[name]
		if !ok {
			return cfg, fmt.Errorf("%w: %q: unknown field (names are exact, lower case)", ErrInvalidConfig, name)
		}
		if seen[name] {
			return cfg, fmt.Errorf("%w: %s: given twice", ErrInvalidConfig, name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return cfg, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, name, err)
		}
		if err := decodeField(reflect.ValueOf(&cfg).Elem().Field(f), raw); err != nil {
			return cfg, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, name, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return cfg, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return cfg, fmt.Errorf("%w: data after the config object", ErrInvalidConfig)
	}
	for _, name := range configFieldOrder {
		if !seen[name] {
			return cfg, fmt.Errorf("%w: %s: missing (every field is part of the key; give the empty value "+
				"the modality calls for)", ErrInvalidConfig, name)
		}
	}
	return cfg, cfg.Validate()
}

// configFieldOrder is the JSON names in the protocol's order.
var configFieldOrder = func() []string {
	t := reflect.TypeFor[PreprocessingConfig]()
	names := make([]string, 0, t.NumField())
	for f := range t.Fields() {
		names = append(names, strings.Split(f.Tag.Get("json"), ",")[0])
	}
	return names
}()

// configFieldIndex maps each JSON name to its struct field's index.
var configFieldIndex = func() map[string]int {
	m := make(map[string]int, len(configFieldOrder))
	for i, name := range configFieldOrder {
		m[name] = i
	}
	return m
}()

// decodeField decodes raw into v by v's type, exactly.
func decodeField(v reflect.Value, raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if bytes.Equal(raw, []byte("null")) {
		if v.Kind() == reflect.Slice {
			v.Set(reflect.MakeSlice(v.Type(), 0, 0)) // an empty list, as Go writes one: the same key as []
			return nil
		}
		return errors.New("null: give the field's empty value (\"\" or 0)")
	}
	switch v.Interface().(type) {
	case string:
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return errors.New("want a string")
		}
		if err := exactString(raw); err != nil {
			return err
		}
		v.SetString(s)
	case int64:
		n, err := exactInt(raw)
		if err != nil {
			return err
		}
		v.SetInt(n)
	case uint64:
		if len(raw) > 0 && raw[0] == '-' {
			return errors.New("want a non-negative integer")
		}
		n, err := strconv.ParseUint(string(raw), 10, 64)
		if err != nil {
			return errors.New("want a non-negative integer")
		}
		v.SetUint(n)
	case [2]int64:
		var nums []json.RawMessage // not json.Number, which takes "448" too
		if err := json.Unmarshal(raw, &nums); err != nil {
			return errors.New("want [width, height]")
		}
		if len(nums) != 2 {
			return fmt.Errorf("want [width, height], got %d values", len(nums))
		}
		for i, n := range nums {
			x, err := exactInt([]byte(n))
			if err != nil {
				return err
			}
			v.Index(i).SetInt(x)
		}
	case []float64:
		var nums []json.RawMessage // not json.Number, which takes "0.5" too
		if err := json.Unmarshal(raw, &nums); err != nil {
			return errors.New("want a list of numbers ([] when empty)")
		}
		out := make([]float64, len(nums))
		for i, n := range nums {
			f, err := strconv.ParseFloat(string(n), 64)
			if err != nil || math.IsInf(f, 0) {
				return fmt.Errorf("value %d (%s): want a finite number", i, n)
			}
			out[i] = f
		}
		v.Set(reflect.ValueOf(out))
	case Modality:
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return errors.New("want a string")
		}
		m, err := ParseModality(s)
		if err != nil {
			return err
		}
		v.Set(reflect.ValueOf(m))
	default:
		return fmt.Errorf("no decoder for %v", v.Type()) // a field added without one: TestDecodeConfigEveryField
	}
	return nil
}

// exactInt parses a JSON integer: no fraction, no exponent, in range.
func exactInt(raw []byte) (int64, error) {
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: want an integer", raw)
	}
	return n, nil
}

// exactString refuses a JSON string (raw, quotes included, already known
// to decode) that encoding/json would decode to other text than it
// spells: bytes that are not UTF-8, or a \u escape of half a surrogate
// pair without its other half. Both decode to U+FFFD, so two different
// model paths (Python spells an undecodable file name's bytes as lone
// surrogates) would take one key: a silent false hit.
func exactString(raw []byte) error {
	if !utf8.Valid(raw) {
		return errors.New("not valid UTF-8")
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if raw[i] != 'u' {
			continue
		}
		r, _ := strconv.ParseUint(string(raw[i+1:i+5]), 16, 32) // decoded: 4 hex digits
		i += 4
		switch {
		case r >= 0xdc00 && r < 0xe000:
			return errors.New("a \\u escape of a lone low surrogate (not text)")
		case r >= 0xd800 && r < 0xdc00:
			if i+6 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' {
				return errors.New("a \\u escape of a lone high surrogate (not text)")
			}
			lo, _ := strconv.ParseUint(string(raw[i+3:i+7]), 16, 32)
			if lo < 0xdc00 || lo >= 0xe000 {
				return errors.New("a \\u escape of a lone high surrogate (not text)")
			}
			i += 6
		}
	}
	return nil
}
