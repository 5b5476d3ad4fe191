package cachekey

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestReadTokensAndShape(t *testing.T) {
	if got, err := ReadTokens(strings.NewReader(" 1 2\n4294967295\t7 ")); err != nil || !slices.Equal(got, []uint32{1, 2, 4294967295, 7}) {
		t.Fatalf("tokens %v %v", got, err)
	}
	for _, bad := range []string{"1 x", "4294967296", "-1"} {
		if _, err := ReadTokens(strings.NewReader(bad)); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("tokens %q: %v", bad, err)
		}
	}
	if got, err := ParseShape("2, 3,4"); err != nil || !slices.Equal(got, []int64{2, 3, 4}) {
		t.Fatalf("shape %v %v", got, err)
	}
	if got, err := ParseShape(""); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("a scalar's shape %v %v", got, err)
	}
	for _, bad := range []string{",", "2,,3", "a", "2.9,3"} {
		if _, err := ParseShape(bad); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("shape %q: %v", bad, err)
		}
	}
}

func TestReadConfigIsBounded(t *testing.T) {
	if _, err := ReadConfig(strings.NewReader(strings.Repeat(" ", MaxConfigBytes+1))); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("an oversized config: %v", err)
	}
	if _, err := ReadConfig(strings.NewReader("{}")); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("an empty config: %v", err)
	}
}

// The docs' example configs are complete configs.
func TestExampleConfigsDecode(t *testing.T) {
	paths, _ := filepath.Glob("../docs/examples/*-config.json")
	if len(paths) == 0 {
		t.Fatal("no example configs in docs/examples")
	}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ReadConfig(f)
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
