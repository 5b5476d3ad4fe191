"""What embcache's vLLM connector costs per item, against what it saves,
measured alternately in one run through a real agent.

    python3 bench_vllm.py --socket /run/embcache/agent.sock [--rows 4096 --cols 1024] [--rounds 100]

- check_*: the scheduler's side for an item the cluster has: from
  ensure_cache_available (which starts the lookup) until has_cache_item
  answers True (the lookup's round trip: the key, then the hit), and the
  time the scheduler's own calls take (they never wait).
- load_*: a worker's start_load_caches of that item, a bf16 [rows, cols]
  tensor (8 MiB by default), until it is in encoder_cache on the device
  (the CPU here).
- file_read_*: reading the same bytes from a file into a tensor (the
  cost of any external cache that keeps values in files).
- encoder_*: a stand-in for the encoder's own time, a CPU projection of
  image patches to the same output ([rows, 588] @ [588, cols], bf16): a
  GPU's vision tower for one image is about as many milliseconds as this
  is on one CPU core; say which when you quote it.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from embcache.vllm import ECConnectorRole, EmbcacheECConnector  # noqa: E402

PROCESSORS = {"image": {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 12845056,
                        "image_mean": [0.48145466, 0.4578275, 0.40821073],
                        "image_std": [0.26862954, 0.26130258, 0.27577711]}}


def config(sock, rank=0):
    return SimpleNamespace(
        model_config=SimpleNamespace(model="bench/vl", revision="r1", dtype="bfloat16", hf_config={"model_type": "bench"},
                                     mm_processor_kwargs={}),
        ec_transfer_config=SimpleNamespace(is_ec_producer=True, is_ec_consumer=True, ec_connector_extra_config=dict(
            agent_socket=sock, tenant="bench", processors=PROCESSORS, abandon_grace_s=1.0)),
        parallel_config=SimpleNamespace(rank=rank, tensor_parallel_size=1), device_config=SimpleNamespace(device="cpu"))


def request(rid, ident):
    f = SimpleNamespace(identifier=ident, modality="image", mm_position=SimpleNamespace(offset=0, length=64))
    return SimpleNamespace(request_id=rid, mm_features=[f])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sched = EmbcacheECConnector(config(args.socket), ECConnectorRole.SCHEDULER)
    worker = EmbcacheECConnector(config(args.socket), ECConnectorRole.WORKER)
    ident = f"bench-{os.getpid()}-{time.time_ns()}"
    value = torch.randn(args.rows, args.cols).to(torch.bfloat16)

    # The item computed once, here, and committed: then every round is a hit.
    req = request("warm", ident)
    while not sched.ensure_cache_available(req, 0):
        time.sleep(0.0005)
    assert not sched.has_cache_item(ident)
    meta = sched.build_connector_meta(SimpleNamespace(scheduled_encoder_inputs={"warm": [0]}))
    worker.bind_connector_metadata(meta)
    worker.save_caches({ident: value}, ident)
    worker.clear_connector_metadata()
    sched.request_finished(req)

    fd, path = tempfile.mkstemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.write(fd, value.view(torch.int16).numpy().tobytes())
    os.close(fd)
    patches = torch.randn(args.rows, 588).to(torch.bfloat16)
    weight = torch.randn(588, args.cols).to(torch.bfloat16)

    check, calls, load, read, enc = [], [], [], [], []
    for i in range(args.rounds):
        req = request(f"r{i}", ident)
        t0 = time.perf_counter()
        spent = 0.0
        while True:
            c0 = time.perf_counter()
            ready = sched.ensure_cache_available(req, 0)
            spent += time.perf_counter() - c0
            if ready:
                break
            time.sleep(0.0001)
        c0 = time.perf_counter()
        hit = sched.has_cache_item(ident)
        sched.update_state_after_alloc(req, 0)
        meta = sched.build_connector_meta(SimpleNamespace(scheduled_encoder_inputs={}))
        spent += time.perf_counter() - c0
        check.append(time.perf_counter() - t0)
        calls.append(spent)
        if not hit:
            raise SystemExit("the item was not a hit: the agent did not keep it")
        cache = {}
        worker.bind_connector_metadata(meta)
        t0 = time.perf_counter()
        worker.start_load_caches(cache)
        _ = cache[ident][-1, -1].item()
        load.append(time.perf_counter() - t0)
        worker.clear_connector_metadata()
        sched.request_finished(req)
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            t = torch.frombuffer(bytearray(f.read()), dtype=torch.int16).view(torch.bfloat16).reshape(args.rows, args.cols)
        _ = t[-1, -1].item()
        read.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = patches @ weight
        _ = out[-1, -1].item()
        enc.append(time.perf_counter() - t0)
    os.remove(path)
    worker.shutdown()
    sched.shutdown()
    ms = lambda xs: statistics.median(xs) * 1e3
    p99 = lambda xs: sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e3
    out = {"value_bytes": value.numel() * 2, "rounds": args.rounds,
           "check_p50_ms": ms(check), "check_p99_ms": p99(check),
           "scheduler_calls_p50_ms": ms(calls), "scheduler_calls_p99_ms": p99(calls),
           "load_p50_ms": ms(load), "load_p99_ms": p99(load),
           "file_read_p50_ms": ms(read), "encoder_standin_p50_ms": ms(enc)}
    out["load_vs_file_read"] = out["load_p50_ms"] / out["file_read_p50_ms"]
    out["check_plus_load_vs_encoder_standin"] = (out["check_p50_ms"] + out["load_p50_ms"]) / out["encoder_standin_p50_ms"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
