package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

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

// A process that computes outside GetOrCompute (a batch, a stage of its
// own) reserves the key, computes and commits; another process then gets
// the value without computing.
func ExampleCache_Reserve() {
	dir, _ := os.MkdirTemp("", "embcache-example-")
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{StoreDir: dir})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	ctx := context.Background()
	// Two processes of one node, with the node's payload store between
	// them (shm in production; an in-memory store here).
	store := payload.NewMemoryStore("host-a", 0)
	plane, _ := payload.NewRouter("host-a", payload.TransportMemory, store)
	var closers []func()
	defer func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}()
	open := func() *coordinator.Cache {
		nc, _ := coordinator.Connect(srv.ClientURL(), coordinator.ModeStrict)
		closers = append(closers, nc.Close)
		c, err := coordinator.New(ctx, nc, coordinator.WithMode(coordinator.ModeStrict),
			coordinator.WithNode("host-a"), coordinator.WithPayload(plane))
		if err != nil {
			panic(err)
		}
		closers = append(closers, func() { c.Close() })
		return c
	}
	encoder, reader := open(), open()

	cfg := cachekey.PreprocessingConfig{CacheSchemaVersion: 1, ModelID: "m", ModelRevision: "r",
		EncoderConfigHash: "h", ProcessorVersion: "p", ResizeMode: "bicubic", ImageSize: [2]int64{224, 224},
		CropMode: "center", NormalizeMean: []float64{0.5}, NormalizeStd: []float64{0.5},
		InputDType: "float32", Modality: cachekey.ModalityImage, Tenant: "acme"}
	key, _ := cachekey.FromRawBytes(cfg, []byte("jpeg bytes"))
	ref := coordinator.NewRef(cfg, key)

	res, err := encoder.Reserve(ctx, ref)
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := res.Commit(ctx, payload.NewTensor(cachekey.Float32, []int64{2}, make([]byte, 8))); err != nil {
		fmt.Println(err)
		return
	}
	_, err = encoder.Reserve(ctx, ref)
	fmt.Println("reserve again:", errors.Is(err, coordinator.ErrHeld))
	v, path, err := reader.Get(ctx, "request-1", ref)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("get:", path, len(v.Tensor.Data), "bytes")
	reader.Release("request-1")
	// Output:
	// reserve again: true
	// get: remote-hit 8 bytes
}
