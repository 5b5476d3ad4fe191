package cachekey

import (
	"errors"
	"math"
	"testing"
)

// FuzzKeys checks that the canonical encoding is injective where it
// matters: moving bytes between two fields, or between shape and data, or
// between modes, never yields an equal key; equal logical inputs always do.
// Any input either keys or fails with a package error, never a panic.
func FuzzKeys(f *testing.F) {
	f.Add("Qwen/Qwen2.5-Omni-7B", "main", []byte("jpeg"), uint8(3), uint64(0), 0.5)
	f.Add("", "", []byte{}, uint8(0), uint64(1), -0.0)
	f.Add("a", "bc", []byte{0, 1, 2, 3, 4, 5, 6, 7}, uint8(1), uint64(1<<63), math.Inf(1))
	f.Fuzz(func(t *testing.T, model, rev string, data []byte, split uint8, epoch uint64, mean float64) {
		c1 := imageConfig()
		c1.ModelID, c1.ModelRevision, c1.WeightEpoch = model, rev, epoch
		c1.NormalizeMean[0] = mean

		joined := model + rev
		k := 0
		if len(joined) > 0 {
			k = int(split) % (len(joined) + 1)
		}
		c2 := c1
		c2.ModelID, c2.ModelRevision = joined[:k], joined[k:]

		k1, err1 := FromRawBytes(c1, data)
		k2, err2 := FromRawBytes(c2, data)
		for _, err := range []error{err1, err2} {
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("unexpected error %v", err)
			}
		}
		if err1 != nil || err2 != nil {
			return
		}
		same := c1.ModelID == c2.ModelID && c1.ModelRevision == c2.ModelRevision
		if (k1 == k2) != same {
			t.Fatalf("model %q/%q vs %q/%q: keys equal=%v", c1.ModelID, c1.ModelRevision, c2.ModelID, c2.ModelRevision, k1 == k2)
		}

		flat, err := FromTensor(c1, Tensor{DType: Uint8, Shape: []int64{int64(len(data))}, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		lifted, err := FromTensor(c1, Tensor{DType: Uint8, Shape: []int64{1, int64(len(data))}, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		longer, _ := FromRawBytes(c1, append(data[:len(data):len(data)], 0))
		if flat == k1 || lifted == flat || longer == k1 {
			t.Fatal("distinct canonical inputs share a key")
		}
		if len(data)%2 == 0 && len(data) > 0 {
			halves, err := FromTensor(c1, Tensor{DType: Uint8, Shape: []int64{2, int64(len(data) / 2)}, Data: data})
			if err != nil || halves == flat || halves == lifted {
				t.Fatalf("shape [2,n/2] collides or fails: %v", err)
			}
		}
	})
}
