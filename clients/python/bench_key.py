"""Key construction through the agent, as a stage pays it, for 200 KiB,
2 MiB and 8 MiB: the client's default (the input copied into the
connection's shared-memory key slot and hashed by the agent where it lies),
the input sent as the call's body (hashed as it arrives), and the JSON call
of the same bytes (base64 in JSON, POST /v1/key: what the client did
before).

    python3 bench_key.py --socket /run/embcache/agent.sock [--rounds 300]

Prints JSON: p50/p99 microseconds per size and path (key_: the default,
body_: sent as the body, json_base64_: the JSON call). The Go floor (the
cachekey package keying the same sizes in memory) is measured beside it by
scripts/bench-agent-key.sh.
"""

import argparse
import base64
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from embcache import EmbeddingCache, EncoderPreprocessingConfig  # noqa: E402

SIZES = {"200KiB": 200 << 10, "2MiB": 2 << 20, "8MiB": 8 << 20}  # the sizes of the Go floor (cachekey)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    cache = EmbeddingCache(args.socket, store_unavailable_mode="strict")
    body = EmbeddingCache(args.socket, store_unavailable_mode="strict", key_slot_max_bytes=0)
    cfg = EncoderPreprocessingConfig(model_id="bench", model_revision="r", encoder_config_hash="h",
                                     processor_version="p", modality="image", tenant="bench", resize_mode="bicubic",
                                     image_size=(448, 448), crop_mode="center", normalize_mean=(0.5,),
                                     normalize_std=(0.5,), input_dtype="float32")
    out = {"rounds": args.rounds}
    for name, size in SIZES.items():
        data = (bytes(range(256)) * (size // 256 + 1))[:size]
        rounds = args.rounds if size < 4_000_000 else max(20, args.rounds // 4)
        # Each path in a block of its own, back to back as a stage keys its
        # inputs (alternating, each would pay for the other's cache misses).
        raw, sent, legacy = [], [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            k = cache.key_from_raw_bytes(cfg, data)
            raw.append(time.perf_counter() - t0)
        for _ in range(rounds):
            t0 = time.perf_counter()
            kb = body.key_from_raw_bytes(cfg, data)
            sent.append(time.perf_counter() - t0)
        assert k is not None and k == kb
        # The JSON call is ~40x slower: fewer rounds.
        for _ in range(min(rounds, 30)):
            t0 = time.perf_counter()
            old = cache._call("POST", "/v1/key", {"config": cfg.to_wire(), "mode": "raw-bytes",
                                                  "data": base64.b64encode(data).decode("ascii")})
            legacy.append(time.perf_counter() - t0)
            assert k is not None and old["key"] == k.key
        q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(len(xs) * p))]  # noqa: E731
        out[name] = {"bytes": size, "rounds": rounds, "json_rounds": len(legacy),
                     "key_p50_us": round(statistics.median(raw) * 1e6, 1), "key_p99_us": round(q(raw, 0.99) * 1e6, 1),
                     "body_p50_us": round(statistics.median(sent) * 1e6, 1), "body_p99_us": round(q(sent, 0.99) * 1e6, 1),
                     "json_base64_p50_us": round(statistics.median(legacy) * 1e6, 1),
                     "json_base64_p99_us": round(q(legacy, 0.99) * 1e6, 1)}
    cache.close()
    body.close()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
