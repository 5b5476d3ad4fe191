"""What a commit costs the computing request, for 1, 8 and 100 MiB: the
copy of the value into the agent's shm slot, and the whole commit (slot
call, copy, commit call). The agent answers the commit once it holds the
slot; checksum, store and NATS commit follow in the agent, and each round
waits (untimed) until the value is shared before the next.

    python3 bench_commit.py --socket /run/embcache/agent.sock [--rounds 20]

Prints JSON: p50/p99 milliseconds per size of the copy, of the commit, and
of the commit beyond its copy.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from embcache import EmbeddingCache, EncoderPreprocessingConfig, Reservation, Tensor  # noqa: E402
from embcache import _slots  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    cache = EmbeddingCache(args.socket, store_unavailable_mode="strict")
    cfg = EncoderPreprocessingConfig(model_id="bench", model_revision="r", encoder_config_hash="h",
                                     processor_version="p", modality="image", tenant="bench", resize_mode="bicubic",
                                     image_size=(448, 448), crop_mode="center", normalize_mean=(0.5,),
                                     normalize_std=(0.5,), input_dtype="float32")
    copies = []
    write_all = _slots.write_all

    def timed_write_all(fd, path, mv):  # times the client's write into the slot file
        t0 = time.perf_counter()
        try:
            write_all(fd, path, mv)
        finally:
            copies.append(time.perf_counter() - t0)

    out = {"rounds": args.rounds}
    for mib in (1, 8, 100):
        value = Tensor(os.urandom(mib << 20), "uint8", (mib << 20,))
        total, copy = [], []
        for i in range(args.rounds):
            key = cache.key_from_raw_bytes(cfg, f"commit-{mib}-{i}-{os.getpid()}-{time.time()}".encode())
            r = cache.reserve(key, "bench")
            assert isinstance(r, Reservation)
            copies.clear()
            _slots.write_all = timed_write_all
            try:
                t0 = time.perf_counter()
                r.commit(value)
                total.append(time.perf_counter() - t0)
            finally:
                _slots.write_all = write_all
            copy.append(sum(copies))
            # Until the agent has shared it (outside the timing): the next
            # commit then does not compete with this one's checksum and
            # store for the machine's two cores, as a stage's GPU forward
            # between two commits lets it finish.
            while cache.get(key, "landed") is None:
                time.sleep(0.001)
            cache.cleanup_request("landed")
        beyond = [t - c for t, c in zip(total, copy)]
        q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(len(xs) * p))]  # noqa: E731
        out[f"{mib}MiB"] = {"copy_p50_ms": round(statistics.median(copy) * 1e3, 2),
                            "commit_p50_ms": round(statistics.median(total) * 1e3, 2),
                            "commit_p99_ms": round(q(total, 0.99) * 1e3, 2),
                            "beyond_copy_p50_ms": round(statistics.median(beyond) * 1e3, 2),
                            "beyond_copy_p99_ms": round(q(beyond, 0.99) * 1e3, 2)}
    cache.cleanup_request("bench")
    cache.close()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
