"""A Python hit of an 8 MiB tensor through the agent, against reading the
same bytes from a local file, measured alternately in one run.

    python3 bench_hit.py --socket /run/embcache/agent.sock [--size-mb 8] [--rounds 200]

Time to a usable read-only buffer: lookup over the socket (the agent pins
the value for the request), a view of the shm file's mapping, a numpy array
over it when numpy is importable (no copy), and touching its last element;
the baseline opens the file and reads it into memory. hit_* reuse the
mapping this process made at an earlier hit of the value (the client keeps
them); hit_unmapped_* map the file each time, as the first hit of a value in
a process does. The three alternate; back_to_back runs hits alone.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from embcache import EmbeddingCache, EncoderPreprocessingConfig, Tensor  # noqa: E402

try:
    import numpy as np
except ImportError:
    np = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--size-mb", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    size = int(args.size_mb * (1 << 20))
    cache = EmbeddingCache(args.socket)
    cfg = EncoderPreprocessingConfig(model_id="bench", model_revision="r", encoder_config_hash="h",
                                     processor_version="p", modality="image", tenant="bench", resize_mode="bicubic",
                                     image_size=(448, 448), crop_mode="center", normalize_mean=(0.5,),
                                     normalize_std=(0.5,), input_dtype="float32")
    key = cache.key_from_raw_bytes(cfg, os.urandom(32))
    data = os.urandom(size)
    cache.get_or_compute(key, lambda: Tensor(data, "float32", (size // 4,)), "warm")  # computed here: shared
    while cache.get(key, "warm") is None:  # the agent answers a commit before it lands
        time.sleep(0.001)
    cache.cleanup_request("warm")
    fd, path = tempfile.mkstemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.write(fd, data)
    os.close(fd)

    fresh = EmbeddingCache(args.socket, mapping_cache_bytes=0)  # maps the file on every hit

    def hit(c=cache):
        """Times the lookup up to a usable array; unmapping is after use."""
        t0 = time.perf_counter()
        emb = c.reserve(key, "bench")
        buf = emb.numpy() if np is not None else emb.buffer
        _ = buf[-1]
        d = time.perf_counter() - t0
        del buf
        emb.close()
        return d

    def read_file():
        t0 = time.perf_counter()
        if np is not None:
            buf = np.fromfile(path, dtype=np.float32)
        else:
            with open(path, "rb") as f:
                buf = f.read()
        _ = buf[-1]
        return time.perf_counter() - t0

    ours, base, unmapped = [], [], []
    for _ in range(args.rounds):
        ours.append(hit())
        base.append(read_file())
        unmapped.append(hit(fresh))
    warm = [hit() for _ in range(args.rounds)]  # back to back: the agent and this interpreter stay hot
    cache.cleanup_request("bench")
    fresh.cleanup_request("bench")
    fresh.close()
    os.remove(path)
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(len(xs) * p))]
    out = {"size_bytes": size, "rounds": args.rounds, "numpy": np is not None,
           "hit_p50_us": statistics.median(ours) * 1e6, "hit_p99_us": q(ours, 0.99) * 1e6,
           "file_read_p50_us": statistics.median(base) * 1e6, "file_read_p99_us": q(base, 0.99) * 1e6}
    out["ratio_p50"] = out["hit_p50_us"] / out["file_read_p50_us"]
    out["hit_unmapped_p50_us"] = statistics.median(unmapped) * 1e6  # the first hit of a value in a process
    out["hit_unmapped_p99_us"] = q(unmapped, 0.99) * 1e6
    out["hit_back_to_back_p50_us"] = statistics.median(warm) * 1e6
    out["hit_back_to_back_p99_us"] = q(warm, 0.99) * 1e6
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
