package agent_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/embedded"
	embnode "github.com/embcache/embcache/node"
)

// A process that is not written in Go (vLLM's encoder, through the Python
// client) keys its input with the node's agent and looks it up: the first
// lookup reserves the key, the process computes and commits; the next
// lookup, from any process of the node, is a hit it maps read-only.
func ExampleClient_Lookup() {
	dir, _ := os.MkdirTemp("", "embcache-example-")
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(dir, "js")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	ctx := context.Background()

	// The node's agent: its cache and shm store, served on a Unix socket.
	n, err := embnode.New(embnode.Options{NATSURL: srv.ClientURL(), Name: "host-a", Strict: true,
		ShmDir: filepath.Join(dir, "shm")})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := n.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer n.Close()
	api, err := agent.New(n.Cache(), n.Store())
	if err != nil {
		fmt.Println(err)
		return
	}
	socket := filepath.Join(dir, "agent.sock")
	l, err := agent.ListenUnix(socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	go api.Serve(l)
	defer api.Shutdown(ctx)

	// A client keys an image under its preprocessing config.
	c := agent.Dial(socket)
	defer c.Close()
	// Every field is part of the key, the empty ones too: a field left out
	// is an error, never a guess.
	config := []byte(`{"cache_schema_version": 1, "model_id": "m", "model_revision": "r",
		"encoder_config_hash": "h", "processor_version": "p", "resize_mode": "bicubic",
		"image_size": [224, 224], "crop_mode": "center", "normalize_mean": [0.5], "normalize_std": [0.5],
		"audio_sample_rate": 0, "audio_codec_version": "", "audio_codec_config_hash": "",
		"video_frame_stride": 0, "input_dtype": "float32", "modality": "image", "weight_epoch": 0,
		"tenant": "acme"}`)
	key, err := c.Key(ctx, agent.KeyRequest{Config: config, Mode: "raw-bytes", Data: []byte("jpeg bytes")})
	if err != nil {
		fmt.Println(err)
		return
	}

	// The first lookup reserves the key: this process computes it.
	first, err := c.Lookup(ctx, key.KeyRef, "request-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("request-1:", first.Status)
	embedding := binary.LittleEndian.AppendUint32(nil, math.Float32bits(0.25))
	if _, err := c.Commit(ctx, first.Reservation, "request-1", "float32", []int64{1}, embedding); err != nil {
		fmt.Println(err)
		return
	}

	// The next lookup is a hit: the value's file in the node's store.
	second, err := c.Lookup(ctx, key.KeyRef, "request-2")
	if err != nil {
		fmt.Println(err)
		return
	}
	data, unmap, err := agent.Map(second.Value)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("request-2:", second.Status, second.Value.Shape, math.Float32frombits(binary.LittleEndian.Uint32(data)))
	unmap()
	c.Release(ctx, "request-1")
	c.Release(ctx, "request-2")
	// Output:
	// request-1: reserved
	// request-2: hit [1] 0.25
}
