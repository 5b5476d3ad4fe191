package localcache_test

import (
	"context"
	"fmt"

	"github.com/embcache/embcache/localcache"
)

type embedding []float32

func (e embedding) Size() int64 { return int64(4 * len(e)) }

func Example() {
	cache, err := localcache.New(localcache.Options[string, embedding]{Budget: localcache.Budget{MaxBytes: 1 << 30}})
	if err != nil {
		panic(err)
	}
	encode := func(context.Context) (embedding, error) { return embedding{0.1, 0.2}, nil }

	v, err := cache.GetOrCompute(context.Background(), "request-1", "image-key", encode)
	fmt.Println(v, err, cache.Stats().Pinned)

	// The request is over: drop its pins (the RFC's cleanup_request).
	fmt.Println(cache.Release("request-1"), cache.Stats().Pinned)
	// Output:
	// [0.1 0.2] <nil> 1
	// 1 0
}
