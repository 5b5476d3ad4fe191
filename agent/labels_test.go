package agent_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/payload"
)

// TestALookupsLabelsAreItsKeysConfigs: a lookup or get of a key this
// agent made (POST /v1/key, /v1/key/bytes, a tokens key's prefixes) takes
// its labels from the config it keyed; one that names other labels, or
// none, is refused with a 400 naming the field. A key it did not make is
// looked up under the labels the request names, which must name a model.
func TestALookupsLabelsAreItsKeysConfigs(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	ctx := context.Background()
	tokensCfg := testConfigMap()
	for name, v := range map[string]any{"modality": "tokens", "resize_mode": "", "image_size": []int{0, 0}, "crop_mode": "",
		"normalize_mean": []float64{}, "normalize_std": []float64{}, "audio_codec_version": "c1",
		"audio_codec_config_hash": "h1", "weight_epoch": 4} {
		tokensCfg[name] = v
	}
	tokens, err := c.Key(ctx, agent.KeyRequest{Config: configJSON(tokensCfg), Mode: "tokens", Tokens: make([]uint32, 40)})
	if err != nil || len(tokens.PrefixKeys) == 0 {
		t.Fatalf("tokens key: %+v %v", tokens, err)
	}
	bytesKey, err := c.KeyBytes(ctx, testConfig(), "raw-bytes", "", nil, strings.NewReader("image-labels-2"))
	if err != nil {
		t.Fatal(err)
	}
	prefix := tokens.KeyRef
	prefix.Key = tokens.PrefixKeys[0]
	for name, ref := range map[string]agent.KeyRef{"key": keyOf(t, c, "image-labels-1"), "key/bytes": bytesKey.KeyRef,
		"tokens": tokens.KeyRef, "prefix": prefix} {
		for field, bad := range map[string]agent.KeyRef{
			"tenant":       {Key: ref.Key, Tenant: "beta", Model: ref.Model, WeightEpoch: ref.WeightEpoch},
			"model":        {Key: ref.Key, Tenant: ref.Tenant, Model: "other", WeightEpoch: ref.WeightEpoch},
			"weight_epoch": {Key: ref.Key, Tenant: ref.Tenant, Model: ref.Model, WeightEpoch: ref.WeightEpoch + 1},
			"model:":       {Key: ref.Key, Tenant: ref.Tenant, WeightEpoch: ref.WeightEpoch}, // none
		} {
			var apiErr *agent.APIError
			_, err := c.Lookup(ctx, bad, "r")
			if !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.HasPrefix(apiErr.Message, "agent: bad request: "+strings.TrimSuffix(field, ":")+":") {
				t.Errorf("%s: lookup naming another %s: %v", name, field, err)
			}
			_, err = c.Get(ctx, bad, "r")
			if !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(apiErr.Message, strings.TrimSuffix(field, ":")) {
				t.Errorf("%s: get naming another %s: %v", name, field, err)
			}
		}
		res, err := c.Lookup(ctx, ref, "r")
		if err != nil || res.Status != agent.StatusReserved || res.KeyRef != ref {
			t.Fatalf("%s: lookup with the config's labels: %+v %v", name, res, err)
		}
		if err := c.Abandon(ctx, res.Reservation, "test"); err != nil {
			t.Fatal(err)
		}
	}

	// A key the agent did not make: its request must name a model, and is
	// never served a record of other labels (it computes its own).
	key := cachekey.Key{0x1a, 0xbe, 0x15}
	committed := coordinator.Ref{Tenant: "acme", Key: key, Model: "m", Epoch: 1}
	if _, err := n.cache.GetOrCompute(ctx, "w", committed, func(context.Context) (*payload.Value, error) {
		return payload.NewTensor(cachekey.Uint8, []int64{4}, []byte("good")), nil
	}); err != nil {
		t.Fatal(err)
	}
	n.cache.Release("w")
	var apiErr *agent.APIError
	if _, err := c.Lookup(ctx, agent.KeyRef{Key: key.String(), Tenant: "acme"}, "r"); !errors.As(err, &apiErr) ||
		apiErr.Status != 400 || !strings.Contains(apiErr.Message, "model") {
		t.Errorf("a lookup without a model: %v", err)
	}
	other := agent.KeyRef{Key: key.String(), Tenant: "acme", Model: "other", WeightEpoch: 1}
	if res, err := c.Get(ctx, other, "r"); err != nil || res.Status != agent.StatusMiss {
		t.Errorf("a get of other labels: %+v %v, want a miss", res, err)
	}
	res, err := c.Lookup(ctx, other, "r")
	if err != nil || res.Status != agent.StatusReserved {
		t.Errorf("a lookup of other labels: %+v %v, want its own compute", res, err)
	} else if err := c.Abandon(ctx, res.Reservation, "test"); err != nil {
		t.Fatal(err)
	}
	res, err = c.Lookup(ctx, agent.KeyRef{Key: key.String(), Tenant: "acme", Model: "m", WeightEpoch: 1}, "r")
	if err != nil || res.Status != agent.StatusHit || !bytes.Equal(mapped(t, res.Value), []byte("good")) {
		t.Fatalf("a lookup of the record's labels: %+v %v", res, err)
	}
	if _, err := c.Release(ctx, "r"); err != nil {
		t.Fatal(err)
	}
}
