"""Key construction through the agent, as a stage pays it, for 200 KiB,
2 MiB and 8 MiB: the client's default (the input copied into the
connection's shared-memory key slot and hashed by the agent where it lies),
the input sent as the call's body (hashed as it arrives), and the JSON call
of the same bytes (base64 in JSON, POST /v1/key: what the client did
before).

    python3 bench_key.py --socket /run/embcache/agent.sock [--rounds 300]

Prints JSON: p50/p99 microseconds per size and path (key: the default,
body: sent as the body, json_base64: the JSON call). The Go floor (the
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
    inputs = {name: (bytes(range(256)) * (size // 256 + 1))[:size] for name, size in SIZES.items()}
    rounds = {name: args.rounds if size < 4_000_000 else max(20, args.rounds // 4) for name, size in SIZES.items()}
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(len(xs) * p))]  # noqa: E731

    def timed(call, n):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            call()
            ts.append(time.perf_counter() - t0)
        return {"p50_us": round(statistics.median(ts) * 1e6, 1), "p99_us": round(q(ts, 0.99) * 1e6, 1)}

    # Each path over every size before the next path: back to back, as a
    # stage keys its inputs, and the JSON path's garbage (it is ~40x
    # slower) comes last, where it slows nothing else down.
    for name, data in inputs.items():
        want = cache.key_from_raw_bytes(cfg, data)
        assert want is not None and body.key_from_raw_bytes(cfg, data) == want
        old = cache._call("POST", "/v1/key", {"config": cfg.to_wire(), "mode": "raw-bytes",
                                              "data": base64.b64encode(data).decode("ascii")})
        assert old["key"] == want.key
        out[name] = {"bytes": len(data), "rounds": rounds[name]}
    for name, data in inputs.items():
        out[name]["key"] = timed(lambda: cache.key_from_raw_bytes(cfg, data), rounds[name])
    for name, data in inputs.items():
        out[name]["body"] = timed(lambda: body.key_from_raw_bytes(cfg, data), rounds[name])
    for name, data in inputs.items():
        wire = {"config": cfg.to_wire(), "mode": "raw-bytes", "data": base64.b64encode(data).decode("ascii")}
        out[name]["json_base64"] = timed(lambda: cache._call("POST", "/v1/key", wire), min(rounds[name], 30))
    cache.close()
    body.close()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
