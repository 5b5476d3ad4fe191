"""One process against real agents: hits, reservations, commits, the
disabled pass-through, an unreachable agent, numpy without a copy."""

import os
import shutil
import socket
import tempfile
import threading
import unittest
from unittest import mock

from embcache import (AgentUnavailable, BadRequest, Embedding, EmbeddingCache, Reservation, ReservationEnded,
                      StageCacheConfig, Tensor)

from . import harness

np = harness.optional("numpy")


class ClientTest(harness.ClusterCase):
    AGENTS = ("n1", "n2")

    def setUp(self):
        self.cache = EmbeddingCache(self.sock)
        self.addCleanup(self.cache.close)

    def test_get_or_compute_once(self):
        key = self.cache.key_from_raw_bytes(harness.config(), b"image-once")
        calls = []

        def compute():
            calls.append(1)
            return Tensor(bytes(range(256)) * 64, "uint8", (64, 256))

        computed = self.cache.get_or_compute(key, compute, "r1")
        # The process that computed gets its own value back, at once.
        self.assertIsInstance(computed, Tensor)
        first = self.cache.get_or_compute(key, compute, "r1")
        self.assertIsInstance(first, Embedding)
        self.assertIn(first.path, ("local-hit", "coalesced"))
        self.assertEqual(first.shape, (64, 256))
        self.assertEqual(first.tobytes(), bytes(range(256)) * 64)
        self.assertTrue(first.buffer.readonly)
        # The other agent (another node) pulls it; compute does not run again.
        with EmbeddingCache(self.sock2) as other:
            second = other.get_or_compute(key, compute, "r2")
            self.assertIn(second.path, ("remote-hit", "waited"))
            self.assertEqual(second.tobytes(), first.tobytes())
            self.assertEqual(second.checksum, first.checksum)
            second.close()
            self.assertEqual(other.cleanup_request("r2"), 1)
        self.assertEqual(len(calls), 1)
        first.close()
        self.assertEqual(self.cache.cleanup_request("r1"), 1)

    def test_get_right_after_get_or_compute_hits(self):
        # The agent answers the commit before it stores the value; a get
        # right after waits for that (it missed about one time in two).
        for i in range(10):
            key = self.cache.key_from_raw_bytes(harness.config(), b"image-then-get-%d" % i)
            value = Tensor(bytes(range(256)) * 256, "uint8", (256, 256))
            self.assertIs(self.cache.get_or_compute(key, lambda: value, "r1"), value)
            got = self.cache.get(key, "r2")
            self.assertIsInstance(got, Embedding, "get %d right after its compute" % i)
            self.assertEqual(got.tobytes(), value.data)
            got.close()
        self.cache.cleanup_request("r2")

    def test_reserve_commit_abandon(self):
        key = self.cache.key_from_raw_bytes(harness.config(), b"image-abandon")
        got = self.cache.reserve(key, "r1")
        self.assertIsInstance(got, Reservation)
        self.cache.abandon(got, "encoder OOM")
        again = self.cache.reserve(key, "r1")  # abandoned: this process may take it again
        self.assertIsInstance(again, Reservation)
        self.assertIsNone(self.cache.commit(again, Tensor(b"\x00\x00\x80\x3f" * 4, "float32", (2, 2))))
        hit = self.cache.reserve(key, "r1")
        self.assertEqual(hit.dtype, "float32")
        self.assertEqual(hit.shape, (2, 2))
        hit.close()
        self.cache.cleanup_request("r1")
        stats = self.cache.stats()
        self.assertGreaterEqual(stats["agent"]["abandons"], 1)
        self.assertGreaterEqual(stats["agent"]["commits"], 1)

    def test_a_reservation_commits_and_abandons_itself(self):
        # In a with block it is abandoned on the way out unless committed.
        key = self.cache.key_from_raw_bytes(harness.config(), b"image-verbs")
        got = self.cache.reserve(key, "r1")
        self.assertIsInstance(got, Reservation)
        with self.assertRaises(ZeroDivisionError):
            with got:
                1 / 0
        self.assertTrue(got.done)
        got.abandon("again")  # ended already: nothing to do
        again = self.cache.reserve(key, "r1")  # given back: this process may take it again
        self.assertIsInstance(again, Reservation)
        with again:
            again.commit(Tensor(b"abcd", "uint8", (4,)))
        self.assertTrue(again.done)
        with self.assertRaises(ReservationEnded):
            again.commit(Tensor(b"abcd", "uint8", (4,)))
        hit = self.cache.reserve(key, "r1")
        self.assertEqual(hit.tobytes(), b"abcd")
        hit.close()
        self.cache.cleanup_request("r1")

    def test_compute_error_abandons(self):
        key = self.cache.key_from_raw_bytes(harness.config(), b"image-error")
        with self.assertRaises(ZeroDivisionError):
            self.cache.get_or_compute(key, lambda: 1 / 0, "r1")
        value = self.cache.get_or_compute(key, lambda: Tensor(b"abcd", "uint8", (4,)), "r1")
        self.assertEqual(value.data, b"abcd")

    def test_threads_share_one_compute(self):
        key = self.cache.key_from_raw_bytes(harness.config(), b"image-threads")
        started, release = threading.Event(), threading.Event()
        calls, results = [], []

        def compute():
            calls.append(1)
            started.set()
            release.wait(10)
            return Tensor(b"x" * 4096, "uint8", (4096,))

        def worker(i):
            got = self.cache.get_or_compute(key, compute, f"t{i}")
            results.append(got.tobytes() if isinstance(got, Embedding) else bytes(got.data))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        threads[0].start()
        self.assertTrue(started.wait(10))
        for t in threads[1:]:
            t.start()
        harness.wait_until(lambda: self.cache.stats()["agent"]["lookups"] >= 4, what="waiters")
        release.set()
        for t in threads:
            t.join(10)
        self.assertEqual(len(calls), 1)
        self.assertEqual(results, [b"x" * 4096] * 4)

    def test_bad_commit_is_refused(self):
        key = self.cache.key_from_raw_bytes(harness.config(), b"image-bad")
        r = self.cache.reserve(key, "r1")
        with self.assertRaises(BadRequest) as e:  # 3 bytes are not one float32
            self.cache.commit(r, Tensor(b"abc", "float32", (1,)))
        self.assertEqual(e.exception.status, 400)
        r.done = False
        self.cache.abandon(r)

    @unittest.skipIf(np is None, "numpy not installed (make test installs Debian's python3-numpy)")
    def test_numpy_hit_is_a_readonly_view(self):
        key = self.cache.key_from_raw_bytes(harness.config(), b"image-numpy")
        want = np.arange(2 * 1024 * 1024, dtype=np.float32).reshape(1024, 2048)
        self.assertIs(self.cache.get_or_compute(key, lambda: want, "r1"), want)
        emb = self.cache.reserve(key, "r1")
        mapping = emb._mmap
        arr = emb.numpy()
        self.assertEqual(arr.dtype, np.float32)
        self.assertEqual(arr.shape, (1024, 2048))
        self.assertTrue(np.array_equal(arr, want))
        self.assertFalse(arr.flags.writeable)
        with self.assertRaises(ValueError):
            arr[0, 0] = 1
        # No copy: the array's memory is the mapping's.
        view = np.frombuffer(emb.buffer, dtype=np.uint8)
        self.assertTrue(np.shares_memory(arr, view))
        del arr, view
        emb.close()
        # A second hit of the value views the same mapping: no new map, no copy.
        again = self.cache.get_or_compute(key, lambda: self.fail("computed twice"), "r2")
        self.assertIs(again._mmap, mapping)
        a2 = again.numpy()
        self.assertTrue(np.array_equal(a2, want))
        del a2
        again.close()
        self.cache.cleanup_request("r1")
        self.cache.cleanup_request("r2")


class MappingsTest(unittest.TestCase):
    def test_reuse_remap_and_bound(self):
        from embcache.embedding import Mappings as _Mappings

        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        a, b = os.path.join(d, "a"), os.path.join(d, "b")
        for p in (a, b):
            with open(p, "wb") as f:
                f.write(b"x" * 4096)
        m = _Mappings(8192)
        first = m.get(a, "sum1", 4096)[0]
        self.assertIs(m.get(a, "sum1", 4096)[0], first)  # the same value: the same pages
        self.assertIsNot(m.get(a, "sum2", 4096)[0], first)  # another value at that path: mapped anew
        with self.assertRaises(Exception):
            m.get(a, "sum3", 8192)  # the hit says more bytes than the file has
        m.get(b, "sum1", 4096)
        m.get(os.path.join(d, "a"), "sum2", 4096)
        self.assertLessEqual(m._bytes, 8192)
        with open(os.path.join(d, "c"), "wb") as f:
            f.write(b"y" * 4096)
        m.get(os.path.join(d, "c"), "s", 4096)  # over the bound: the oldest is dropped
        self.assertLessEqual(m._bytes, 8192)
        self.assertEqual(len(m._lru), 2)


class PassThroughTest(unittest.TestCase):
    def test_disabled_calls_compute_every_time_and_never_the_agent(self):
        d = tempfile.mkdtemp()
        path = os.path.join(d, "agent.sock")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen(1)
        listener.setblocking(False)
        try:
            cache = EmbeddingCache.from_stage_config({"embedding_cache": {"enable_embedding_cache": False, "agent_socket": path}})
            calls = []
            for i in range(3):
                self.assertEqual(cache.get_or_compute(None, lambda: calls.append(i) or "value", f"r{i}"), "value")
            self.assertEqual(len(calls), 3)
            self.assertEqual(cache.cleanup_request("r0"), 0)
            with self.assertRaises(BlockingIOError):
                listener.accept()  # nobody connected
        finally:
            listener.close()
            os.remove(path)
            os.rmdir(d)

    def test_unreachable_agent(self):
        missing = os.path.join(tempfile.gettempdir(), "embcache-no-such-agent.sock")
        from embcache import EmbeddingCacheKey

        key = EmbeddingCacheKey(key="ab" * 32, tenant="acme")
        degrade = EmbeddingCache(missing)
        with self.assertLogs("embcache", "WARNING"):
            self.assertEqual(degrade.get_or_compute(key, lambda: "local", "r1"), "local")
        self.assertEqual(degrade.degraded, 1)
        strict = EmbeddingCache(missing, store_unavailable_mode="strict")
        with self.assertRaises(AgentUnavailable) as e:
            strict.get_or_compute(key, lambda: "local", "r1")
        # It says what to check, not only the socket's errno.
        self.assertIn("no agent listens there", str(e.exception))

    def test_socket_from_the_environment(self):
        # As the agent reads it (docs/operations.md exports it for both).
        missing = os.path.join(tempfile.gettempdir(), "embcache-env-agent.sock")
        with mock.patch.dict(os.environ, {"EMBCACHE_AGENT_SOCKET": missing}):
            self.assertEqual(EmbeddingCache().socket_path, missing)
        with mock.patch.dict(os.environ, {}, clear=True):
            with self.assertRaises(ValueError):
                EmbeddingCache()

    def test_stage_config(self):
        c = StageCacheConfig.from_stage_config({"embedding_cache": {
            "enable_embedding_cache": True, "store_unavailable_mode": "strict", "agent_socket": "/run/a.sock",
            "lease_ttl_s": 2, "store_ttl_s": 600, "shm_max_bytes": 1 << 30}})
        self.assertTrue(c.strict)
        self.assertEqual(c.agent_args()[:2], ["--socket", "/run/a.sock"])
        self.assertIn("--strict", c.agent_args())
        self.assertFalse(StageCacheConfig.from_stage_config(None).enable_embedding_cache)
        with self.assertRaises(ValueError):
            StageCacheConfig.from_stage_config({"embedding_cache": {"store_unavailable_mode": "maybe"}})
        with self.assertRaises(ValueError):
            StageCacheConfig.from_stage_config({"embedding_cache": {"enable_cache": True}})
        # YAML's "false" is a string: it must not turn the cache on.
        for bad in ("false", "true", 0, 1, None):
            with self.assertRaises(TypeError):
                StageCacheConfig.from_stage_config({"embedding_cache": {"enable_embedding_cache": bad}})
        with self.assertRaises(TypeError):
            StageCacheConfig.from_stage_config({"embedding_cache": {"request_timeout_s": "300"}})
        with self.assertRaises(TypeError):
            EmbeddingCache("/run/a.sock", enabled="false")
        # As the agent: a value's last event must outlive it in the stream.
        with self.assertRaisesRegex(ValueError, "store_ttl_s"):
            StageCacheConfig.from_stage_config({"embedding_cache": {"store_ttl_s": 2 * 86400}})


class MappingsTest(unittest.TestCase):
    def test_a_replaced_file_is_not_the_answers_value(self):
        # A file replaced between the agent's answer and the map (the key
        # computed again, to other bytes) was mapped, and kept, under the
        # answer's checksum (a helper's hunt found it).
        from embcache.embedding import Mappings
        from embcache import EmbcacheError
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        path = os.path.join(d, "value")
        good, other = bytes(range(32)), bytes(32)
        with open(path, "wb") as f:
            f.write(b"encoding" + good)
        m = Mappings(1 << 20)
        with self.assertRaisesRegex(EmbcacheError, "no longer holds"):
            m.get(path, other.hex(), 8)
        mm, _ = m.get(path, good.hex(), 8)
        self.assertEqual(mm[:8], b"encoding")

if __name__ == "__main__":
    unittest.main()
