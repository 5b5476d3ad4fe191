"""EmbcacheECConnector driven as vLLM drives an EC connector, against real
agents on a real embedded NATS server, with real torch tensors.

vLLM is not installable here, so the driver below calls the connector in
vLLM's order, written from (vllm-project/vllm):
- vllm/v1/core/sched/scheduler.py: a waiting request is skipped for the
  step unless ensure_cache_available(request, num_computed_tokens); each
  item not in the engine's encoder cache is loaded when
  has_cache_item(identifier), then allocated with update_state_after_alloc
  (request, index), else scheduled for the encoder
  (scheduled_encoder_inputs); build_connector_meta(scheduler_output) ends
  the step; request_finished(request) when a request ends;
- vllm/v1/worker/ec_connector_model_runner_mixin.py: per rank,
  bind_connector_metadata, start_load_caches(encoder_cache) (not on a
  producer-only instance), the batched encoder, then for each output
  encoder_cache[mm_hash] = output and save_caches(encoder_cache, mm_hash)
  (gpu_model_runner._execute_mm_encoder), get_finished, and
  clear_connector_metadata;
- vllm/distributed/ec_transfer/ec_connector/base.py at
  035e2dd3a4b5edaa4c3f3ab98795f6e34eebf2c6 (the base class and its
  optional methods).
Each engine is a process of its own with 2 simulated TP ranks (each rank
its own worker connector and encoder cache, run in turn: both compute a
miss, as a tensor-parallel encoder does).
"""

from __future__ import annotations

import collections
import hashlib
import multiprocessing
import os
import time
import unittest
from types import SimpleNamespace

from tests.harness import ClusterCase, optional

torch = optional("torch")

TP = 2
ROWS, COLS = 256, 1024  # a bf16 [256, 1024] value: 512 KiB
PROCESSORS = {"image": {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136,
                        "max_pixels": 12845056, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                        "image_std": [0.26862954, 0.26130258, 0.27577711], "patch_size": 14}}


_references = {}


def reference(identifier: str):
    """The encoder's output for an item: a function of its identifier."""
    if identifier in _references:
        return _references[identifier]
    seed = int.from_bytes(hashlib.sha256(identifier.encode()).digest()[:8], "little")
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(ROWS, COLS, generator=g).to(torch.bfloat16)
    _references[identifier] = t
    return t


def vllm_config(sock, rank: int = 0, extra=None):
    """An engine's config as the connector reads it: ec_connector_extra_config
    is extra (by default this test's), with sock as its agent_socket unless
    sock is None ($EMBCACHE_AGENT_SOCKET then)."""
    ec_extra = dict(extra) if extra is not None else dict(tenant="acme", processors=PROCESSORS, abandon_grace_s=0.5)
    if sock is not None:
        ec_extra["agent_socket"] = sock
    return SimpleNamespace(
        model_config=SimpleNamespace(model="Qwen/Qwen2.5-VL-7B-Instruct", revision="r1", dtype="bfloat16",
                                     hf_config={"model_type": "qwen2_5_vl", "vision_config": {"depth": 32}},
                                     mm_processor_kwargs={}),
        ec_transfer_config=SimpleNamespace(is_ec_producer=True, is_ec_consumer=True, ec_connector_extra_config=ec_extra),
        parallel_config=SimpleNamespace(rank=rank, tensor_parallel_size=TP),
        device_config=SimpleNamespace(device="cpu"))


def request(req_id: str, images, prefix: str = "img"):
    feats, offset = [], 5
    for image in images:
        feats.append(SimpleNamespace(identifier=f"{prefix}-{image:04d}", modality="image",
                                     mm_position=SimpleNamespace(offset=offset, length=64)))
        offset += 70
    return SimpleNamespace(request_id=req_id, mm_features=feats)


class Timed:
    """Calls of a connector, timed: what a step spends in the cache."""

    def __init__(self, connector):
        self.c, self.spent = connector, 0.0

    def __getattr__(self, name):
        f = getattr(self.c, name)

        def timed(*a, **kw):
            start = time.monotonic()
            try:
                return f(*a, **kw)
            finally:
                self.spent += time.monotonic() - start
        return timed


def run_engine(name: str, sock, requests, out, extra=None) -> None:
    """One engine: its scheduler and TP worker connectors, stepped until
    every request has run one step. Puts its report on out: among it, the
    longest time a step spent in the connector's calls (the rest is the
    driver's: the stand-in encoder and the checks)."""
    from embcache import EmbeddingCache
    from embcache.vllm import ECConnectorRole, EmbcacheECConnector

    sched = Timed(EmbcacheECConnector(vllm_config(sock, 0, extra), ECConnectorRole.SCHEDULER))
    workers = [Timed(EmbcacheECConnector(vllm_config(sock, rank, extra), ECConnectorRole.WORKER)) for rank in range(TP)]
    caches = [dict() for _ in range(TP)]  # each rank's encoder_cache: identifier -> tensor
    forwards = collections.Counter()  # items run through the encoder (by rank 0's count)
    wrong, longest_step, deferred = [], 0.0, 0
    waiting = collections.deque(requests)
    while waiting:
        for c in [sched, *workers]:
            c.spent = 0.0
        scheduled, computed = [], {}
        for req in list(waiting):
            if not sched.ensure_cache_available(req, 0):
                deferred += 1
                continue
            waiting.remove(req)
            compute = []
            for i, f in enumerate(req.mm_features):
                if f.identifier in caches[0] or f.identifier in computed.get("ids", set()):
                    continue  # in the engine's encoder cache (check_and_update_cache)
                if sched.has_cache_item(f.identifier):
                    sched.update_state_after_alloc(req, i)
                else:
                    compute.append(i)
                computed.setdefault("ids", set()).add(f.identifier)
            if compute:
                computed.setdefault("inputs", {})[req.request_id] = compute
            scheduled.append(req)
        out_meta = sched.build_connector_meta(SimpleNamespace(scheduled_encoder_inputs=computed.get("inputs", {})))
        for rank, w in enumerate(workers):
            w.bind_connector_metadata(out_meta)
            w.start_load_caches(caches[rank])
            ids = [r.mm_features[i].identifier for r in scheduled for i in computed.get("inputs", {}).get(r.request_id, [])]
            outputs = [reference(x) for x in ids]  # the batched encoder
            if rank == 0:
                forwards.update(ids)
            for x, o in zip(ids, outputs):
                caches[rank][x] = o
                w.save_caches(caches[rank], x)
            for r in scheduled:  # _gather_mm_embeddings: every item of the step is there, right
                for f in r.mm_features:
                    got = caches[rank].get(f.identifier)
                    if got is None or not torch.equal(got, reference(f.identifier)):
                        wrong.append((name, rank, r.request_id, f.identifier, None if got is None else "bytes"))
            w.get_finished(set())
            w.clear_connector_metadata()
        for r in scheduled:
            sched.request_finished(r)
        # The engine's encoder cache frees what no running request uses
        # (every request here runs one step).
        for c in caches:
            c.clear()
        longest_step = max(longest_step, sum(c.spent for c in [sched, *workers]))
        if not scheduled:
            time.sleep(0.002)  # every waiting request is deferred: the engine idles a step
    # What the engine still pins on its agent, before shutdown (which would
    # release it anyway). request_finished releases pins on the lookup
    # threads: they are given up to 5 s.
    probe = EmbeddingCache(sock) if sock is not None else EmbeddingCache()
    try:
        deadline = time.monotonic() + 5
        while True:
            pins = probe.stats().get("cache", {}).get("Local", {}).get("Pinned")  # None without an agent
            if not pins or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        probe.close()
    stats = sched.stats()
    wstats = [w.stats() for w in workers]
    for w in workers:
        w.shutdown()
    sched.shutdown()
    out.put(dict(name=name, forwards=dict(forwards), wrong=wrong, longest_step=longest_step, deferred=deferred,
                 sched=stats, workers=wstats, pins=pins))


@unittest.skipIf(torch is None, "torch is not installed (make test installs python3-torch)")
class ConnectorDriverTest(ClusterCase):
    AGENTS = ("n1", "n2")

    def drive(self, n_requests, n_images, engines, seed=7, pins_per_engine=False):
        """Runs engines over n_requests requests of 1-3 of n_images images
        (Zipf-like reuse) and checks: each item computed once in the
        cluster, every rank's tensor the reference's, no step spending
        more than 2 s in the connector, no pin left. Returns a summary."""
        import random

        rng = random.Random(seed)
        weights = [1.0 / (i + 1) ** 0.8 for i in range(n_images)]
        # Identifiers of this run alone (the tests of the class share agents).
        all_reqs = [request(f"req-{i}", rng.choices(range(n_images), weights, k=rng.randint(1, 3)), f"s{seed}")
                    for i in range(n_requests)]
        distinct = {f.identifier for r in all_reqs for f in r.mm_features}
        socks = [self.sock, self.sock2]  # engines alternate between the two agents (nodes)
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        procs = [ctx.Process(target=run_engine, args=(f"e{e}", socks[e % 2], all_reqs[e::engines], out))
                 for e in range(engines)]
        start = time.monotonic()
        for p in procs:
            p.start()
        reports = [out.get(timeout=240) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        took = time.monotonic() - start
        forwards = collections.Counter()
        for r in reports:
            forwards.update(r["forwards"])
            self.assertEqual(r["wrong"], [], f"{r['name']}: a rank's tensor differs from the reference")
        twice = {k: v for k, v in forwards.items() if v > 1}
        self.assertEqual(twice, {}, "items computed more than once in the cluster: "
                         + "; ".join(f"{r['name']}: {r['sched']} {r['workers']}" for r in reports))
        self.assertEqual(set(forwards), distinct, "every item computed somewhere")
        if pins_per_engine:
            self.assertEqual([r["pins"] for r in reports], [0] * engines, "pins left when the last request finished")
        longest = max(r["longest_step"] for r in reports)
        self.assertLess(longest, 2.0, "a step spent that long in the connector")
        for sock in (self.sock, self.sock2):
            from embcache import EmbeddingCache

            c = EmbeddingCache(sock)
            try:
                local = c.stats()["cache"]["Local"]
            finally:
                c.close()
            self.assertEqual((local["Pinned"], local["PinnedBytes"]), (0, 0), f"pins left on {sock}")
        return (f"{engines} engines x {TP} ranks, {n_requests} requests, {len(distinct)} items: "
                f"{sum(forwards.values())} forwards, longest step in the connector {longest * 1000:.1f} ms, "
                f"{took:.1f} s; " + "; ".join(f"{r['name']}: {r['sched']}" for r in reports))

    def test_three_engines_two_ranks_compute_each_item_once(self):
        print("\n" + self.drive(200, 40, 3))

    def test_a_thousand_requests_leave_no_pin(self):
        """Each of the two engines has an agent of its own: what that agent
        pins when the engine's last request has finished, before the
        engine shuts down, is what request_finished left."""
        print("\n" + self.drive(1000, 120, 2, seed=11, pins_per_engine=True))


if __name__ == "__main__":
    unittest.main()


@unittest.skipIf(torch is None, "torch is not installed (make test installs python3-torch)")
class ConnectorWithoutAgentTest(unittest.TestCase):
    def test_an_engine_without_its_agent_computes_every_item(self):
        """The agent's socket does not answer: every lookup fails, the
        scheduler defers nothing for long and the engine computes each
        item itself (degrade mode), with the right values."""
        import queue
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            out = queue.Queue()
            reqs = [request(f"r{i}", [i % 5, (i + 1) % 5], "noagent") for i in range(12)]
            run_engine("alone", os.path.join(d, "no-agent.sock"), reqs, out)
            r = out.get(timeout=1)
        self.assertEqual(r["wrong"], [])
        self.assertEqual(r["sched"]["lookup_failures"], 5, r["sched"])
        self.assertEqual(r["sched"]["hits"] + r["sched"]["reserved"], 0, r["sched"])
        self.assertEqual(set(r["forwards"]), {f"noagent-{i:04d}" for i in range(5)}, "every item computed here")


class ConformanceTest(unittest.TestCase):
    def test_the_connector_is_a_vllm_ec_connector(self):
        """With vLLM importable: the connector subclasses vLLM's own
        ECConnectorBase and implements every abstract method of it."""
        from embcache.vllm import HAVE_VLLM, EmbcacheECConnector

        if not HAVE_VLLM:
            self.skipTest("vLLM is not installed here (it is not installable on this machine): "
                          "the stand-in base is used")
        import importlib
        import inspect

        base = importlib.import_module("vllm.distributed.ec_transfer.ec_connector.base").ECConnectorBase
        self.assertTrue(issubclass(EmbcacheECConnector, base))
        self.assertEqual(EmbcacheECConnector.__abstractmethods__, frozenset())
        for name, member in inspect.getmembers(base, inspect.isfunction):
            if name.startswith("__"):
                continue
            mine = getattr(EmbcacheECConnector, name)
            self.assertEqual(list(inspect.signature(mine).parameters)[:len(inspect.signature(member).parameters)],
                             list(inspect.signature(member).parameters), name)
