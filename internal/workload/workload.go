// Package workload is the demo's and the benchmarks' stand-in for a
// multimodal serving stack: deterministic JPEG inputs, a preprocessing
// config, an encoder that does real CPU work on the decoded pixels (and
// may wait to stand for GPU time), and a Zipf request stream.
//
// The benchmark harness, a module of its own (bench/), imports it too:
// the go command checks internal/ by import path, and that module's path,
// github.com/embcache/embcache/bench, is under this module's.
package workload

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
)

// Config is the preprocessing config of the demo's image encoder.
func Config(tenant string) cachekey.PreprocessingConfig {
	return cachekey.PreprocessingConfig{
		CacheSchemaVersion: 1, ModelID: "Qwen/Qwen2.5-Omni-7B", ModelRevision: "demo",
		EncoderConfigHash: "b3:vit-demo", ProcessorVersion: "embcache-demo-1",
		ResizeMode: "bicubic", ImageSize: [2]int64{224, 224}, CropMode: "center",
		NormalizeMean: []float64{0.48145466, 0.4578275, 0.40821073},
		NormalizeStd:  []float64{0.26862954, 0.26130258, 0.27577711},
		InputDType:    "bfloat16", Modality: cachekey.ModalityImage, Tenant: tenant,
	}
}

// Image returns input i: a 224x224 JPEG, the same bytes every time.
func Image(i int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, 224, 224))
	r := rand.New(rand.NewPCG(uint64(i), 0x9e3779b97f4a7c15))
	cx, cy := r.Float64()*224, r.Float64()*224
	hue := r.Float64()
	for y := range 224 {
		for x := range 224 {
			d := math.Hypot(float64(x)-cx, float64(y)-cy)
			v := 0.5 + 0.5*math.Sin(d/(6+hue*10))
			img.SetRGBA(x, y, color.RGBA{uint8(255 * v * hue), uint8(255 * (1 - v)), uint8(x ^ y ^ i), 255})
		}
	}
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: 90}); err != nil {
		panic("workload: encoding a JPEG in memory cannot fail: " + err.Error())
	}
	return buf.Bytes()
}

// Encoder is the stand-in encoder: it decodes the JPEG and expands its
// pixels into an embedding of Bytes bytes (float32), deterministically,
// then waits Wait to stand for GPU time. Forwards are serialised, as on
// one GPU.
type Encoder struct {
	Bytes int
	Wait  time.Duration

	gpu      sync.Mutex
	forwards int
}

// Forwards returns how many forwards ran.
func (e *Encoder) Forwards() int {
	e.gpu.Lock()
	defer e.gpu.Unlock()
	return e.forwards
}

// Encode runs one forward.
func (e *Encoder) Encode(ctx context.Context, jpegBytes []byte) (*payload.Value, error) {
	img, err := jpeg.Decode(bytes.NewReader(jpegBytes))
	if err != nil {
		return nil, fmt.Errorf("workload: decoding input: %w", err)
	}
	b := img.Bounds()
	pixels := make([]float32, 0, b.Dx()*b.Dy())
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			pixels = append(pixels, float32(r+2*g+3*bl)/float32(6*0xffff))
		}
	}
	n := max(e.Bytes/4, 1)
	data := make([]byte, 4*n)
	for i := range n {
		v := pixels[i%len(pixels)]*0.5 + float32(i%97)*1e-3
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	e.gpu.Lock()
	defer e.gpu.Unlock()
	if e.Wait > 0 {
		select {
		case <-time.After(e.Wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	e.forwards++
	return payload.NewTensor(cachekey.Float32, []int64{int64(n)}, data), nil
}

// Requests returns n input indexes drawn from Zipf(s) over unique inputs,
// with every input appearing at least once when n >= unique.
func Requests(n, unique int, s float64, seed uint64) []int {
	r := rand.New(rand.NewPCG(seed, 7))
	out := make([]int, 0, n)
	for i := 0; i < unique && i < n; i++ {
		out = append(out, i)
	}
	if s <= 1 {
		s = 1.0001
	}
	z := rand.NewZipf(r, s, 1, uint64(unique-1))
	for len(out) < n {
		out = append(out, int(z.Uint64()))
	}
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// BareTCPServer writes data to every connection and closes it: the floor a
// pull over loopback can reach, for the benchmarks' baselines. stop closes
// the listener and waits for the server to end.
func BareTCPServer(data []byte) (addr string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write(data)
			c.Close()
		}
	}()
	return l.Addr().String(), func() { l.Close(); <-done }, nil
}

// ReadBareTCP reads len(dst) bytes from the BareTCPServer at addr over a
// connection of its own: the baseline's one transfer.
func ReadBareTCP(addr string, dst []byte) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = io.ReadFull(c, dst)
	return err
}
