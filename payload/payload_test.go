package payload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/embcache/embcache/cachekey"
)

func testValues() map[string]*Value {
	data := make([]byte, 2*3*4)
	for i := range data {
		data[i] = byte(i + 1)
	}
	return map[string]*Value{
		"tensor":        NewTensor(cachekey.Float32, []int64{2, 3}, data),
		"scalar":        NewTensor(cachekey.Int32, []int64{}, []byte{1, 2, 3, 4}),
		"empty tensor":  NewTensor(cachekey.BFloat16, []int64{0, 1024}, []byte{}),
		"tokens":        NewTokens([]uint32{1, 2, 3, 0xffffffff}),
		"hidden prefix": NewHiddenPrefix([]uint32{5, 6, 7}, cachekey.BFloat16, []int64{3, 4}, data),
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for name, v := range testValues() {
		t.Run(name, func(t *testing.T) {
			enc, err := Encode(v)
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(enc)) != v.Size() {
				t.Fatalf("encoded %d bytes, Size says %d", len(enc), v.Size())
			}
			sum, err := Sum(v)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Verify(enc, int64(len(enc)), sum)
			if err != nil {
				t.Fatal(err)
			}
			if got.Kind != v.Kind || got.Tensor.DType != v.Tensor.DType || !bytes.Equal(got.Tensor.Data, v.Tensor.Data) ||
				len(got.Tokens) != len(v.Tokens) || len(got.Tensor.Shape) != len(v.Tensor.Shape) {
				t.Fatalf("round trip: %+v != %+v", got, v)
			}
			for i := range v.Tokens {
				if got.Tokens[i] != v.Tokens[i] {
					t.Fatal("tokens differ")
				}
			}
			if v.Kind != KindTokens {
				off := len(enc) - len(v.Tensor.Data)
				if off%DataAlign != 0 {
					t.Fatalf("data at offset %d, not %d-aligned", off, DataAlign)
				}
			}
			// The encoding is canonical: re-encoding the decoded value is identical.
			again, _ := Encode(got)
			if !bytes.Equal(again, enc) {
				t.Fatal("re-encoding differs")
			}
		})
	}
}

func TestEveryFlippedByteIsCorrupt(t *testing.T) {
	for name, v := range testValues() {
		enc, _ := Encode(v)
		sum, _ := Sum(v)
		for i := range enc {
			bad := bytes.Clone(enc)
			bad[i] ^= 0x40
			if got, err := Verify(bad, int64(len(bad)), sum); !errors.Is(err, ErrCorrupt) || got != nil {
				t.Fatalf("%s: byte %d flipped: %v", name, i, err)
			}
		}
		if _, err := Verify(enc[:len(enc)-1], int64(len(enc)), sum); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: truncated: %v", name, err)
		}
		if _, err := Verify(append(bytes.Clone(enc), 0), int64(len(enc)), sum); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: extended: %v", name, err)
		}
	}
}

func TestDecodeRejectsNonCanonical(t *testing.T) {
	enc, _ := Encode(testValues()["hidden prefix"])
	for name, edit := range map[string]func([]byte) []byte{
		"short":    func(b []byte) []byte { return b[:10] },
		"magic":    func(b []byte) []byte { b[0] = 'X'; return b },
		"version":  func(b []byte) []byte { b[8] = 9; return b },
		"reserved": func(b []byte) []byte { b[60] = 1; return b },
		"padding":  func(b []byte) []byte { b[PreludeSize+8*2+4*3] = 1; return b },
		"kind":     func(b []byte) []byte { b[10] = 7; return b },
		"dtype":    func(b []byte) []byte { b[11] = 99; return b },
		"ndim":     func(b []byte) []byte { b[12] = 200; return b },
		"total":    func(b []byte) []byte { b[40]++; return b },
		"data len": func(b []byte) []byte { b[24] = 0xff; b[25] = 0xff; return b },
		"shape":    func(b []byte) []byte { b[PreludeSize] = 4; return b },
	} {
		if _, err := Decode(edit(bytes.Clone(enc))); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

func TestValidate(t *testing.T) {
	for name, v := range map[string]*Value{
		"no kind":          {},
		"tensor w/ tokens": {Kind: KindTensor, Tokens: []uint32{1}, Tensor: cachekey.Tensor{DType: cachekey.Uint8, Shape: []int64{1}, Data: []byte{1}}},
		"tokens w/ tensor": {Kind: KindTokens, Tokens: []uint32{1}, Tensor: cachekey.Tensor{DType: cachekey.Uint8}},
		"no tokens":        NewTokens(nil),
		"prefix no tokens": NewHiddenPrefix(nil, cachekey.Uint8, []int64{1}, []byte{1}),
		"shape mismatch":   NewTensor(cachekey.Float32, []int64{2}, make([]byte, 7)),
		"negative dim":     NewTensor(cachekey.Float32, []int64{-1}, nil),
		"unknown dtype":    NewTensor(0, []int64{1}, []byte{1}),
	} {
		if _, err := Encode(v); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("%s: %v, want ErrInvalidValue", name, err)
		}
	}
}

func TestLocation(t *testing.T) {
	key, _ := cachekey.Parse("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
	obj := ObjectID{Tenant: "acme", Key: key}
	back, err := ParseObjectID(obj.String())
	if err != nil || back != obj {
		t.Fatalf("%v %v", back, err)
	}
	for _, bad := range []string{"", "acme", "acme/", "../" + key.String(), "acme/../x", "a.b/" + key.String(),
		"acme/" + key.String() + "/x", "*/" + key.String(), "acme /" + key.String(), "acme/" + key.String()[:63]} {
		if _, err := ParseObjectID(bad); !errors.Is(err, ErrInvalidLocation) {
			t.Errorf("ParseObjectID(%q) = %v", bad, err)
		}
	}
	loc := Location{Transport: TransportShm, Node: "n1", Object: obj.String(), Size: 128, Checksum: Checksum{1}}
	raw, _ := json.Marshal(loc)
	var decoded Location
	if err := json.Unmarshal(raw, &decoded); err != nil || decoded != loc || decoded.Validate() != nil {
		t.Fatalf("JSON round trip: %s %v", raw, err)
	}
	for _, bad := range []string{`{"transport":"ftp","object":"acme/` + key.String() + `","size":100}`,
		`{"transport":"shm","object":"acme/x","size":100}`, `{"transport":"shm","object":"acme/` + key.String() + `","size":1}`} {
		var l Location
		_ = json.Unmarshal([]byte(bad), &l)
		if err := l.Validate(); !errors.Is(err, ErrInvalidLocation) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	var l Location
	if err := json.Unmarshal([]byte(`{"checksum":"zz"}`), &l); err == nil {
		t.Error("bad checksum text accepted")
	}
}

func TestMemoryStore(t *testing.T) {
	ctx := context.Background()
	m := NewMemoryStore("n1", 1000)
	key, _ := cachekey.Parse("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
	obj := ObjectID{Tenant: "acme", Key: key}
	v := testValues()["tensor"]
	loc, err := m.Put(ctx, obj, v)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := m.Generation(ctx, loc)
	loc2, err := m.Put(ctx, obj, v)
	if err != nil || loc2 != loc || m.Bytes() != loc.Size {
		t.Fatalf("second put: %v %v", loc2, err)
	}
	// A delete of what was seen before the second put leaves it.
	if err := m.Delete(ctx, loc, first); err != nil || m.Bytes() != loc.Size {
		t.Fatalf("a delete of the version before the second put: %v, %d bytes held", err, m.Bytes())
	}
	got, err := m.Get(ctx, loc)
	if err != nil || !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
		t.Fatal(err)
	}
	bad := loc
	bad.Checksum[0] ^= 1
	if _, err := m.Get(ctx, bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("wrong checksum: %v", err)
	}
	big := NewTensor(cachekey.Uint8, []int64{2000}, make([]byte, 2000))
	if _, err := m.Put(ctx, ObjectID{Tenant: "acme", Key: cachekey.Key{1}}, big); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("over budget: %v", err)
	}
	seen, _ := m.Generation(ctx, loc)
	if err := m.Delete(ctx, loc, seen); err != nil || m.Bytes() != 0 {
		t.Fatal(err)
	}
	if _, err := m.Get(ctx, loc); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

// FuzzDecode: any bytes decode to a valid value or fail with ErrCorrupt,
// and whatever decodes re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, v := range testValues() {
		enc, _ := Encode(v)
		f.Add(enc)
	}
	f.Add([]byte(Magic))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		again, err := Encode(v)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded value does not re-encode to its bytes: %v", err)
		}
	})
}
