package coordinator_test

import (
	"context"
	"fmt"
	"os"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/payload"
)

func Example() {
	dir, _ := os.MkdirTemp("", "embcache-example-")
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{StoreDir: dir})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	nc, _ := coordinator.Connect(srv.ClientURL(), coordinator.ModeStrict)
	defer nc.Close()
	cache, err := coordinator.New(context.Background(), nc, coordinator.WithMode(coordinator.ModeStrict))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cache.Close()

	cfg := cachekey.PreprocessingConfig{CacheSchemaVersion: 1, ModelID: "m", ModelRevision: "r",
		EncoderConfigHash: "h", ProcessorVersion: "p", ResizeMode: "bicubic", ImageSize: [2]int64{224, 224},
		CropMode: "center", NormalizeMean: []float64{0.5}, NormalizeStd: []float64{0.5},
		InputDType: "float32", Modality: cachekey.ModalityImage, Tenant: "acme"}
	key, _ := cachekey.FromRawBytes(cfg, []byte("jpeg bytes"))
	encode := func(context.Context) (*payload.Value, error) {
		return payload.NewTensor(cachekey.Float32, []int64{2}, make([]byte, 8)), nil
	}
	for _, req := range []string{"request-1", "request-2"} {
		_, path, err := cache.GetOrComputePath(context.Background(), req, coordinator.NewRef(cfg, key), encode)
		fmt.Println(req, path, err)
		cache.Release(req)
	}
	// Output:
	// request-1 computed <nil>
	// request-2 local-hit <nil>
}
