package cachekey_test

import (
	"fmt"

	"github.com/embcache/embcache/cachekey"
)

func Example() {
	cfg := cachekey.PreprocessingConfig{
		CacheSchemaVersion: 1,
		ModelID:            "Qwen/Qwen2.5-Omni-7B",
		ModelRevision:      "main",
		EncoderConfigHash:  "b3:vit",
		ProcessorVersion:   "4.57.1",
		ResizeMode:         "bicubic",
		ImageSize:          [2]int64{448, 448},
		CropMode:           "center",
		NormalizeMean:      []float64{0.5, 0.5, 0.5},
		NormalizeStd:       []float64{0.5, 0.5, 0.5},
		InputDType:         "bfloat16",
		Modality:           cachekey.ModalityImage,
		Tenant:             "acme",
	}
	k, err := cachekey.FromRawBytes(cfg, []byte("...jpeg bytes..."))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(k.String()))

	cfg.Tenant = "acme.prod"
	_, err = cachekey.FromRawBytes(cfg, []byte("...jpeg bytes..."))
	fmt.Println(err)
	// Output:
	// 64
	// cachekey: invalid preprocessing config: tenant: byte 4 is '.', want [A-Za-z0-9_-]
}
