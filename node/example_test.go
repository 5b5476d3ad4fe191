package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
)

// Two nodes of one machine share an embedding: the first computes it, the
// second reads the first's value from the node's shm store.
func ExampleNew() {
	dir, _ := os.MkdirTemp("", "embcache-example-")
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(dir, "js")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()

	cfg := cachekey.PreprocessingConfig{CacheSchemaVersion: 1, ModelID: "m", ModelRevision: "r",
		EncoderConfigHash: "h", ProcessorVersion: "p", ResizeMode: "bicubic", ImageSize: [2]int64{224, 224},
		CropMode: "center", NormalizeMean: []float64{0.5}, NormalizeStd: []float64{0.5},
		InputDType: "float32", Modality: cachekey.ModalityImage, Tenant: "acme"}
	key, _ := cachekey.FromRawBytes(cfg, []byte("jpeg bytes"))
	ref := coordinator.NewRef(cfg, key)
	encode := func(context.Context) (*payload.Value, error) {
		return payload.NewTensor(cachekey.Float32, []int64{2}, make([]byte, 8)), nil
	}

	ctx := context.Background()
	for _, name := range []string{"gpu-0", "gpu-1"} {
		n, err := node.New(node.Options{NATSURL: srv.ClientURL(), Name: "host-a", Strict: true,
			ShmDir: filepath.Join(dir, "shm")})
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := n.Start(ctx); err != nil {
			fmt.Println(err)
			return
		}
		_, path, err := n.Cache().GetOrComputePath(ctx, "request-"+name, ref, encode)
		fmt.Println(name, path, err)
		n.Cache().Release("request-" + name)
		n.Close()
	}
	// Output:
	// gpu-0 computed <nil>
	// gpu-1 remote-hit <nil>
}
