// Package cachekey builds the content-addressed keys of embcache.
//
// A Key is the full 256-bit BLAKE3 digest of a canonical message that holds
// the mode (raw input bytes, decoded tensor, or token sequence), every field
// of the PreprocessingConfig, and a digest of the input. Every field that can
// change the encoder's output is part of the key: a field left out would let
// two different encoder outputs share a key, a silent false hit, which is the
// worst failure a cache of this kind can have. docs/protocol.md specifies the
// encoding byte for byte, and testdata/vectors.json holds golden vectors that
// any other implementation can check itself against.
//
// Keys are printed as 64 lowercase hex digits, so they can never contain a
// character that is special to NATS subjects or KV keys.
package cachekey
