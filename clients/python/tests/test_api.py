"""The RFC's API beyond get_or_compute, against a real agent: get (never
reserves), put, token and hidden-prefix values, keys of bytes sent as they
are, the connection pool, torch views, and the asyncio client."""

import asyncio
import threading
import time
import unittest

from embcache import (AsyncEmbeddingCache, EmbcacheError, Embedding, EmbeddingCache, HiddenPrefix, Reservation,
                      StageCacheConfig, Tensor, Tokens)

from . import harness

np = harness.optional("numpy")
torch = harness.optional("torch")


class APITest(harness.ClusterCase):
    AGENTS = ("n1", "n2")

    def client(self, sock=None, **kw) -> EmbeddingCache:
        kw.setdefault("store_unavailable_mode", "strict")
        cache = EmbeddingCache(sock or self.sock, **kw)
        self.addCleanup(cache.close)
        return cache

    def test_get_never_reserves(self):
        a, b = self.client(), self.client(self.sock2)
        key = a.key_from_raw_bytes(harness.config(), b"get-only")
        self.assertIsNone(a.get(key, "r1"))
        # The miss reserved nothing: another process is granted the key at once.
        r = b.reserve(key, "r2")
        self.assertIsInstance(r, Reservation)
        t0 = time.monotonic()
        self.assertIsNone(a.get(key, "r1"))  # computing elsewhere: a miss, not a wait
        self.assertLess(time.monotonic() - t0, 1.0)
        b.commit(r, Tensor(b"got it", "uint8", (6,)))
        harness.wait_until(lambda: a.get(key, "r1") is not None, what="the committed value")
        hit = a.get(key, "r1")
        self.assertEqual(hit.tobytes(), b"got it")
        hit.close()
        self.assertGreaterEqual(a.cleanup_request("r1"), 1)

    def test_put(self):
        a, b = self.client(), self.client(self.sock2)
        key = a.key_from_raw_bytes(harness.config(), b"put-me")
        self.assertTrue(a.put(key, Tensor(b"first", "uint8", (5,))))
        harness.wait_until(lambda: b.get(key, "r") is not None, what="the put value on the other node")
        self.assertFalse(b.put(key, Tensor(b"other", "uint8", (5,))))  # the cluster has it: it stands
        hit = b.get(key, "r")
        self.assertEqual(hit.tobytes(), b"first")
        hit.close()
        b.cleanup_request("r")

    def test_tokens_and_hidden_prefix(self):
        c = self.client()
        cfg = harness.config(modality="tokens", resize_mode="", image_size=(0, 0), crop_mode="", normalize_mean=(),
                             normalize_std=(), input_dtype="int32", audio_codec_version="c1",
                             audio_codec_config_hash="h1")
        key = c.key_from_tokens(cfg, list(range(40)), block_size=16)
        self.assertEqual(len(key.prefix_keys), 2)
        tokens = Tokens([7, 8, 9, 2**32 - 1])
        self.assertIs(c.get_or_compute(key, lambda: tokens, "r1"), tokens)
        hit = c.reserve(key, "r1")
        self.assertEqual((hit.kind, hit.tokens), ("tokens", (7, 8, 9, 2**32 - 1)))
        hit.close()

        key2 = c.key_from_raw_bytes(harness.config(), b"voice reference")
        prefix = HiddenPrefix([1, 2, 3], Tensor(bytes(range(24)), "float32", (3, 2)))
        self.assertIs(c.get_or_compute(key2, lambda: prefix, "r1"), prefix)
        hit = c.reserve(key2, "r1")
        self.assertEqual((hit.kind, hit.tokens, hit.dtype, hit.shape), ("hidden-prefix", (1, 2, 3), "float32", (3, 2)))
        self.assertEqual(hit.tobytes(), bytes(range(24)))
        hit.close()
        c.cleanup_request("r1")

    @unittest.skipIf(np is None, "numpy not installed")
    def test_empty_tensors(self):
        c = self.client()
        for i, shape in enumerate([(0,), (0, 4), (3, 0, 2)]):
            empty = np.zeros(shape, dtype=np.float32)
            key = c.key_from_decoded_tensor(harness.config(), empty)
            self.assertIs(c.get_or_compute(key, lambda: empty, f"e{i}"), empty)
            hit = c.reserve(key, f"e{i}")
            self.assertEqual((hit.shape, hit.tobytes()), (shape, b""))
            self.assertEqual(hit.numpy().shape, shape)
            hit.close()
            c.cleanup_request(f"e{i}")

    def test_tokens_hit_elsewhere_names_no_dtype(self):
        a, b = self.client(), self.client(self.sock2)
        cfg = harness.config(modality="tokens", resize_mode="", image_size=(0, 0), crop_mode="", normalize_mean=(),
                             normalize_std=(), input_dtype="int32", audio_codec_version="c1",
                             audio_codec_config_hash="h1")
        key = a.key_from_tokens(cfg, [5, 6, 7, 8])
        a.put(key, Tokens([1, 2]))
        harness.wait_until(lambda: b.get(key, "t") is not None, what="the tokens elsewhere")
        hit = b.get(key, "t")
        self.assertEqual((hit.kind, hit.dtype, hit.tokens), ("tokens", "", (1, 2)))
        with self.assertRaises(EmbcacheError):
            hit.numpy()
        hit.close()
        b.cleanup_request("t")

    def test_settings_are_checked(self):
        for bad in (0, -1, float("inf"), float("nan"), 1e12):
            with self.assertRaises(ValueError):
                EmbeddingCache(self.sock, agent_timeout=bad)
            with self.assertRaises(ValueError):
                EmbeddingCache(self.sock, compute_timeout=bad)
        with self.assertRaises(ValueError):
            StageCacheConfig(agent_timeout_s=float("inf"))
        # A stage without the block, or with an empty one: off.
        for stage in ({"stage_id": 0, "engine_args": {}}, {"embedding_cache": None}, {}, None):
            self.assertFalse(StageCacheConfig.from_stage_config(stage).enable_embedding_cache, stage)
        with self.assertRaises(TypeError):
            StageCacheConfig.from_stage_config({"embedding_cache": "true"})
        with self.assertRaises(ValueError):  # the block itself, with a misspelt field
            StageCacheConfig.from_stage_config({"enable_embedding_cache": True, "agent_sockett": "/x"})
        self.assertTrue(StageCacheConfig.from_stage_config({"enable_embedding_cache": True}).enable_embedding_cache)
        with self.assertRaises(EmbcacheError):
            EmbeddingCache(enabled=False).reserve(None, "r")

    def test_keys_of_sent_bytes_are_the_json_keys(self):
        # /v1/key/bytes (what the client sends) against /v1/key (JSON,
        # base64): the same key, for raw bytes and for tensors.
        c = self.client()
        cfg = harness.config()
        for size in (0, 1, 200 << 10, (2 << 20) + 8):
            data = bytes(i % 251 for i in range(size))
            legacy = c._call("POST", "/v1/key", {"config": cfg.to_wire(), "mode": "raw-bytes",
                                                 "data": __import__("base64").b64encode(data).decode()})
            self.assertEqual(c.key_from_raw_bytes(cfg, data).key, legacy["key"], size)
            if size % 8 == 0:
                legacy = c._call("POST", "/v1/key", {"config": cfg.to_wire(), "mode": "decoded-tensor", "dtype": "float32",
                                                     "shape": [2, size // 8],
                                                     "data": __import__("base64").b64encode(data).decode()})
                got = c.key_from_decoded_tensor(cfg, data, dtype="float32", shape=(2, size // 8))
                self.assertEqual(got.key, legacy["key"], size)

    def test_threads_leave_a_bounded_pool(self):
        c = self.client(max_idle_connections=4)
        key = c.key_from_raw_bytes(harness.config(), b"pool")
        c.put(key, Tensor(b"pooled", "uint8", (6,)))
        harness.wait_until(lambda: c.get(key, "warm") is not None, what="the value")
        start = threading.Barrier(300)
        errors = []

        def worker(i):
            try:
                start.wait(30)
                hit = c.get(key, f"t{i}")
                if hit is None or hit.tobytes() != b"pooled":
                    errors.append(f"t{i}: {hit!r}")
                c.cleanup_request(f"t{i}")
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(300)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertLessEqual(c.open_connections(), 4)
        # The agent sees the others close (asynchronously).
        harness.wait_until(lambda: c.stats()["agent"]["connections"] <= 4, what="the agent seeing them close")
        # close() while calls are in flight: they finish; nothing raises.
        results = []
        ts = [threading.Thread(target=lambda: results.append(c.get(key, "x"))) for _ in range(8)]
        for t in ts:
            t.start()
        c.close()
        for t in ts:
            t.join(30)
        self.assertEqual(len(results), 8)
        self.assertTrue(all(isinstance(r, Embedding) for r in results))
        harness.wait_until(lambda: c.open_connections() == 0, what="the pool closed")

    @unittest.skipIf(torch is None, "torch not installed (make test installs Debian's python3-torch)")
    def test_torch_views(self):
        c = self.client()
        key = c.key_from_raw_bytes(harness.config(), b"torch")
        want = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
        self.assertIs(c.get_or_compute(key, lambda: want, "r1"), want)
        first = c.reserve(key, "r1")
        t = first.torch()
        self.assertTrue(torch.equal(t, want))
        # A write (which would segfault on the shared read-only pages) lands
        # in this tensor's private pages: the cache's value is unchanged.
        t[0, 0] = -1.0
        t.add_(1)
        self.assertEqual(float(t[0, 0]), 0.0)
        again = c.reserve(key, "r2")
        self.assertTrue(torch.equal(again.torch(), want))
        self.assertTrue(torch.equal(again.torch(clone=True), want))
        if np is not None:
            self.assertTrue(np.array_equal(again.numpy(), want.numpy()))
        # bfloat16 round-trips through the cache too.
        kb = c.key_from_raw_bytes(harness.config(), b"torch-bf16")
        bf = torch.linspace(-2, 2, 100).to(torch.bfloat16)
        c.get_or_compute(kb, lambda: bf, "r1")
        hb = c.reserve(kb, "r1")
        self.assertEqual(hb.dtype, "bfloat16")
        self.assertTrue(torch.equal(hb.torch(), bf))
        for e in (first, again, hb):
            e.close()
        c.cleanup_request("r1")
        c.cleanup_request("r2")

    @unittest.skipIf(torch is None, "torch not installed")
    def test_torch_key_of_decoded_tensor(self):
        c = self.client()
        x = torch.ones(3, 8, 8, dtype=torch.float16)
        k1 = c.key_from_decoded_tensor(harness.config(), x)
        k2 = c.key_from_decoded_tensor(harness.config(), x.numpy().tobytes(), dtype="float16", shape=(3, 8, 8))
        self.assertEqual(k1, k2)
        self.assertNotEqual(k1, c.key_from_decoded_tensor(harness.config(), x.reshape(3, 64)))


class AsyncTest(harness.ClusterCase):
    def test_loop_keeps_ticking_while_a_lookup_waits(self):
        async def main():
            holder = EmbeddingCache(self.sock, store_unavailable_mode="strict")
            cache = AsyncEmbeddingCache(self.sock, store_unavailable_mode="strict")
            try:
                key = await cache.key_from_raw_bytes(harness.config(), b"async")
                r = holder.reserve(key, "holder")  # another process computes, for a second
                self.assertIsInstance(r, Reservation)
                ticks = 0

                async def ticker():
                    nonlocal ticks
                    while True:
                        await asyncio.sleep(0.01)
                        ticks += 1

                tick = asyncio.ensure_future(ticker())
                loop = asyncio.get_running_loop()
                loop.call_later(1.0, lambda: threading.Thread(
                    target=holder.commit, args=(r, Tensor(b"async!", "uint8", (6,)))).start())
                t0 = time.monotonic()
                got = await cache.get_or_compute(key, lambda: self.fail("computed twice"), "r1")
                waited = time.monotonic() - t0
                tick.cancel()
                self.assertGreaterEqual(waited, 0.9)
                self.assertEqual(got.tobytes(), b"async!")
                got.close()
                # 10 ms ticks through a 1 s wait: the loop was never blocked.
                self.assertGreater(ticks, 50)

                async def encoder():
                    await asyncio.sleep(0)
                    return Tensor(b"coroutine", "uint8", (9,))

                k2 = await cache.key_from_raw_bytes(harness.config(), b"async-compute")
                v = await cache.get_or_compute(k2, encoder, "r1")
                self.assertEqual(v.data, b"coroutine")
                self.assertGreaterEqual(await cache.cleanup_request("r1"), 1)
            finally:
                await cache.close()
                holder.close()

        asyncio.run(main())

    def test_cancelled_lookup_gives_its_reservation_back(self):
        async def main():
            cache = AsyncEmbeddingCache(self.sock, store_unavailable_mode="strict")
            other = EmbeddingCache(self.sock, store_unavailable_mode="strict")
            try:
                key = await cache.key_from_raw_bytes(harness.config(), b"cancelled")
                r = other.reserve(key, "o")
                task = asyncio.ensure_future(cache.reserve(key, "r1"))
                await asyncio.sleep(0.2)  # the lookup waits in the agent
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                # The cancelled lookup is granted the key now, and must give it back.
                await asyncio.to_thread(other.abandon, r)
                again = await asyncio.wait_for(asyncio.to_thread(other.reserve, key, "o"), 30)
                self.assertIsInstance(again, Reservation)
                other.abandon(again)
            finally:
                await cache.close()
                other.close()

        asyncio.run(main())

    def test_async_compute_that_fails_or_is_cancelled_gives_the_key_back(self):
        async def main():
            cache = AsyncEmbeddingCache(self.sock, store_unavailable_mode="strict")
            other = EmbeddingCache(self.sock, store_unavailable_mode="strict", compute_timeout=10)
            try:
                key = await cache.key_from_raw_bytes(harness.config(), b"async-give-back")

                async def fails():
                    raise ZeroDivisionError("encoder")

                with self.assertRaises(ZeroDivisionError):
                    await cache.get_or_compute(key, fails, "r1")
                again = await asyncio.wait_for(asyncio.to_thread(other.reserve, key, "o"), 30)
                self.assertIsInstance(again, Reservation)
                again.abandon()

                started = asyncio.Event()

                async def hangs():
                    started.set()
                    await asyncio.sleep(60)

                task = asyncio.ensure_future(cache.get_or_compute(key, hangs, "r1"))
                await started.wait()
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                again = await asyncio.wait_for(asyncio.to_thread(other.reserve, key, "o"), 30)
                self.assertIsInstance(again, Reservation)
                again.abandon()
            finally:
                await cache.close()
                other.close()

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
