package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// exactNames checks that data is one JSON object whose member names are
// v's struct fields' JSON names exactly, each at most once. encoding/json
// takes any spelling of a name (Config for config) and keeps the last of
// two: a body with a second config or token list would be keyed by the
// one the client did not mean (a silent false hit).
func exactNames(data []byte, v any) error {
	names := jsonNames(reflect.TypeOf(v).Elem())
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("want a JSON object")
	}
	seen := make(map[string]bool, len(names))
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		name := t.(string) // an object's keys are strings
		switch {
		case !names[name]:
			return fmt.Errorf("%q: unknown field (names are exact, lower case)", name)
		case seen[name]:
			return fmt.Errorf("%s: given twice", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("%s: %v", name, err)
		}
	}
	return nil
}

var jsonNamesOf sync.Map // reflect.Type -> map[string]bool

// jsonNames is the set of t's fields' JSON names.
func jsonNames(t reflect.Type) map[string]bool {
	if m, ok := jsonNamesOf.Load(t); ok {
		return m.(map[string]bool)
	}
	m := make(map[string]bool, t.NumField())
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case name == "" && f.Anonymous && f.Type.Kind() == reflect.Struct: // promoted: KeyRef in LookupRequest
			for n := range jsonNames(f.Type) {
				m[n] = true
			}
		case name == "":
			m[f.Name] = true
		default:
			m[name] = true
		}
	}
	jsonNamesOf.Store(t, m)
	return m
}
