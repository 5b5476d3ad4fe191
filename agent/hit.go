package agent

import (
	"context"
	"encoding/hex"
	"errors"
	"os"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/payload"
)

// hit makes sure v lies, verified, in this node's shm store and says
// where. The same value and an unchanged file (one stat) are not checked
// again: hits are the path a Python stage waits on. A file that fails its
// own check is payload.ErrCorrupt.
func (s *Server) hit(ctx context.Context, ref coordinator.Ref, v *payload.Value) (*Hit, error) {
	obj := ref.Object()
	path := s.store.Path(obj)
	seen, known := s.stored.Get(obj)
	if known {
		fi, err := os.Stat(path)
		known = err == nil && seen.v == v && fi.Size() == seen.size && fi.ModTime().UnixNano() == seen.modTime
	}
	sum := seen.sum
	if !known {
		var err error
		if sum, err = s.place(ctx, obj, v); err != nil {
			return nil, err
		}
		if fi, err := os.Stat(path); err == nil {
			s.stored.Add(obj, storedFile{v: v, size: fi.Size(), modTime: fi.ModTime().UnixNano(), sum: sum})
		}
	}
	return &Hit{File: path, Offset: payload.DataOffset(v), Length: int64(len(v.Tensor.Data)),
		Kind: v.Kind.String(), DType: dtypeName(v), Shape: v.Tensor.Shape, Tokens: v.Tokens,
		Checksum: hex.EncodeToString(sum[:])}, nil
}

// place makes sure the node's file of obj holds v's bytes, checked: the
// client maps it without checking it. A file with v's checksum is hashed
// (once per file, by the store); a missing one is written; one that holds
// other bytes, consistent with its own trailer (another value of the key,
// from before or after an invalidation), is replaced by v's. A file whose
// bytes disagree with its own trailer was changed in place: the store
// removes it, and v, which may map it, is not written back
// (payload.ErrCorrupt: the caller drops v).
func (s *Server) place(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Checksum, error) {
	sum, err := payload.Sum(v)
	if err != nil {
		return sum, err
	}
	header, err := payload.Header(v)
	if err != nil {
		return sum, err
	}
	loc := payload.Location{Transport: payload.TransportShm, Node: s.store.Node(), Address: s.store.Dir(),
		Object: obj.String(), Size: int64(len(header) + len(v.Tensor.Data)), Checksum: sum}
	check, err := s.store.Get(ctx, loc)
	switch {
	case err == nil:
		check.Close()
		return sum, nil
	case errors.Is(err, payload.ErrCorrupt):
		if _, serr := os.Stat(s.store.Path(obj)); serr != nil {
			return sum, err // it failed its own check, and is gone
		}
	case !errors.Is(err, payload.ErrNotFound):
		return sum, err
	}
	if _, err := s.store.Put(ctx, obj, v); err != nil {
		return sum, err
	}
	return sum, nil
}

// dtypeName is a hit's dtype: none for a tokens value, which has no tensor.
func dtypeName(v *payload.Value) string {
	if v.Kind == payload.KindTokens {
		return ""
	}
	return v.Tensor.DType.String()
}
