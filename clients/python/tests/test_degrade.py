"""Failures of the cache, each against a real agent (or none): in degrade
mode every call still serves the request (get_or_compute returns the
computed value), failures are counted and logged once per episode; in
strict mode each raises its typed error; no call waits longer than its
timeout."""

import logging
import os
import signal
import tempfile
import threading
import time
import unittest
from unittest import mock

from embcache import (AgentTimeout, AgentUnavailable, ComputeTimeout, Embedding, EmbeddingCache, EmbeddingCacheKey,
                      InvalidValue, Reservation, StoreFull, StoreUnavailable, Tensor)

import embcache._degrade

from . import harness

VALUE = Tensor(b"\x01\x02\x03\x04" * 256, "uint8", (1024,))


def both(sock, **kw):
    """A degrade-mode client and a strict one."""
    return (EmbeddingCache(sock, store_unavailable_mode="degrade", **kw),
            EmbeddingCache(sock, store_unavailable_mode="strict", **kw))


class NoAgentTest(unittest.TestCase):
    def test_every_call_degrades_without_an_agent(self):
        missing = os.path.join(tempfile.mkdtemp(), "no-agent.sock")
        self.addCleanup(os.rmdir, os.path.dirname(missing))
        degrade, strict = both(missing)
        key = EmbeddingCacheKey(key="ab" * 32, tenant="acme")
        with self.assertLogs("embcache", "WARNING") as logs:
            self.assertIsNone(degrade.key_from_raw_bytes(harness.config(), b"jpeg"))
            self.assertEqual(degrade.get_or_compute(None, lambda: "local", "r1"), "local")
            self.assertEqual(degrade.get_or_compute(key, lambda: "local", "r1"), "local")
            self.assertIsNone(degrade.get(key, "r1"))
            self.assertFalse(degrade.put(key, VALUE))
            self.assertEqual(degrade.cleanup_request("r1"), 0)
            self.assertEqual(degrade.stats()["client"]["degraded"], 6)
        # One episode, one line: not one per call.
        self.assertEqual(len(logs.records), 1, [r.getMessage() for r in logs.records])
        self.assertEqual(degrade.degraded, 6)
        for call in (lambda: strict.key_from_raw_bytes(harness.config(), b"jpeg"),
                     lambda: strict.get_or_compute(key, lambda: "local", "r1"), lambda: strict.get(key, "r1"),
                     lambda: strict.cleanup_request("r1"), lambda: strict.stats()):
            with self.assertRaises(AgentUnavailable):
                call()


class AgentFailureTest(unittest.TestCase):
    """Each test has its own cluster: they kill, stop and starve agents."""

    def setUp(self):
        self.cluster = harness.Cluster()
        self.addCleanup(self.cluster.close)

    def agent(self, node, *extra):
        sock = self.cluster.agent(node, *extra)
        return sock, self.cluster.procs[-1]

    def test_agent_killed_mid_compute(self):
        sock, proc = self.agent("n1")
        degrade, strict = both(sock)
        self.addCleanup(degrade.close)
        self.addCleanup(strict.close)
        k1 = degrade.key_from_raw_bytes(harness.config(), b"killed-1")
        k2 = degrade.key_from_raw_bytes(harness.config(), b"killed-2")

        def compute_then_kill():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            return VALUE

        with self.assertLogs("embcache", "WARNING"):
            self.assertIs(degrade.get_or_compute(k1, compute_then_kill, "r1"), VALUE)
        self.assertEqual(degrade.degraded, 1)
        with self.assertRaises(AgentUnavailable) as e:
            strict.get_or_compute(k2, lambda: VALUE, "r1")  # the agent is gone before the lookup
        self.assertIsNone(e.exception.value)

    def test_agent_restarted_mid_compute_leaves_no_slot(self):
        # The new agent empties the slot directory when it starts, before
        # the client makes the slot the old one named: the failed commit
        # left that file in shared memory (a new user's walkthrough).
        sock, proc = self.agent("n1")
        degrade = EmbeddingCache(sock, store_unavailable_mode="degrade")
        self.addCleanup(degrade.close)
        key = degrade.key_from_raw_bytes(harness.config(), b"restarted")
        slots = os.path.join(self.cluster.shm, "n1") + ".slots"

        def compute_then_restart():
            proc.kill()
            proc.wait(10)
            self.agent("n1")
            return VALUE

        with self.assertLogs("embcache", "WARNING"):
            self.assertIs(degrade.get_or_compute(key, compute_then_restart, "r1"), VALUE)
        self.assertEqual(os.listdir(slots), [])

    def test_agent_killed_after_lookup_strict_error_carries_value(self):
        sock, proc = self.agent("n1")
        strict = EmbeddingCache(sock, store_unavailable_mode="strict")
        self.addCleanup(strict.close)
        key = strict.key_from_raw_bytes(harness.config(), b"strict-killed")

        def compute_then_kill():
            proc.kill()
            proc.wait(10)
            return VALUE

        with self.assertRaises(AgentUnavailable) as e:
            strict.get_or_compute(key, compute_then_kill, "r1")
        self.assertIs(e.exception.value, VALUE)  # the compute is not thrown away

    def test_hung_agent_costs_agent_timeout(self):
        sock, proc = self.agent("n1")
        degrade, strict = both(sock, agent_timeout=1.0, compute_timeout=60.0)
        self.addCleanup(degrade.close)
        self.addCleanup(strict.close)
        key = degrade.key_from_raw_bytes(harness.config(), b"hung")
        proc.send_signal(signal.SIGSTOP)
        self.addCleanup(proc.send_signal, signal.SIGCONT)
        # A signal takes effect asynchronously: until the agent is stopped,
        # it may still answer.
        harness.wait_until(lambda: harness.process_state(proc.pid) == "T", what="the agent stopped")
        for call, want in ((lambda: degrade.key_from_raw_bytes(harness.config(), b"hung"), None),
                           (lambda: degrade.get_or_compute(key, lambda: "local", "r1"), "local"),
                           (lambda: degrade.cleanup_request("r1"), 0)):
            t0 = time.monotonic()
            with self.assertLogs("embcache", "WARNING") if degrade.degraded == 0 else _nothing():
                self.assertEqual(call(), want)
            elapsed = time.monotonic() - t0
            # agent_timeout (1 s); a lookup's silences max(agent_timeout, 2 s)
            # (its heartbeats are 1 s apart): never compute_timeout, never twice.
            self.assertLess(elapsed, 2.9)
        t0 = time.monotonic()
        with self.assertRaises(AgentTimeout):
            strict.key_from_raw_bytes(harness.config(), b"hung")
        self.assertLess(time.monotonic() - t0, 1.9)
        proc.send_signal(signal.SIGCONT)
        # The agent answers again: the episode ends, with one line (once the
        # quiet time since the episode's first line has passed).
        with mock.patch.object(embcache._degrade, "_QUIET", 0.0), self.assertLogs("embcache", "WARNING") as logs:
            harness.wait_until(lambda: degrade.key_from_raw_bytes(harness.config(), b"hung") == key,
                               what="the agent answering again")
        self.assertIn("serves again", logs.records[-1].getMessage())

    def test_compute_past_the_timeout(self):
        sock, _ = self.agent("n1", "--compute-timeout", "1s")
        degrade, strict = both(sock)
        self.addCleanup(degrade.close)
        self.addCleanup(strict.close)
        stats = lambda: degrade.stats()["agent"]["reservations"]  # noqa: E731

        def slow():
            harness.wait_until(lambda: stats() == 0, what="the agent ending the reservation")
            return VALUE

        k1 = degrade.key_from_raw_bytes(harness.config(), b"slow-1")
        harness.wait_until(lambda: stats() == 0, what="no reservation")
        with self.assertLogs("embcache", "WARNING"):
            self.assertIs(degrade.get_or_compute(k1, slow, "r1"), VALUE)
        k2 = strict.key_from_raw_bytes(harness.config(), b"slow-2")
        with self.assertRaises(ComputeTimeout) as e:
            strict.get_or_compute(k2, slow, "r1")
        self.assertEqual(e.exception.status, 410)
        self.assertIn("compute timeout", str(e.exception))
        self.assertIs(e.exception.value, VALUE)

    def test_full_store(self):
        # n1 computes a 2 MiB value; n2's store holds 1 MiB, so its hit
        # cannot land in shared memory.
        sock1, _ = self.agent("n1")
        sock2, _ = self.agent("n2", "--shm-max-bytes", str(1 << 20))
        big = Tensor(bytes(2 << 20), "uint8", (2 << 20,))
        with EmbeddingCache(sock1, store_unavailable_mode="strict") as c1:
            key = c1.key_from_raw_bytes(harness.config(), b"too big for n2")
            self.assertIs(c1.get_or_compute(key, lambda: big, "r1"), big)
            harness.wait_until(lambda: c1.get(key, "r1") is not None, what="the commit")
            c1.cleanup_request("r1")
        degrade, strict = both(sock2)
        self.addCleanup(degrade.close)
        self.addCleanup(strict.close)
        with self.assertRaises(StoreFull):
            strict.get_or_compute(key, lambda: big, "r2")
        with self.assertLogs("embcache", "WARNING"):
            self.assertIs(degrade.get_or_compute(key, lambda: big, "r2"), big)

    def test_strict_agent_with_nats_down(self):
        sock, _ = self.agent("n1", "--strict")
        degrade, strict = both(sock)
        self.addCleanup(degrade.close)
        self.addCleanup(strict.close)
        key = degrade.key_from_raw_bytes(harness.config(), b"nats down")
        serve = self.cluster.procs[0]
        serve.kill()
        serve.wait(10)
        t0 = time.monotonic()
        harness.wait_until(lambda: not harness.healthy(sock), timeout=5, what="/healthz turning non-200")
        self.assertLess(time.monotonic() - t0, 2.0)
        with self.assertRaises(StoreUnavailable) as e:
            strict.get_or_compute(key, lambda: VALUE, "r1")
        self.assertIsInstance(e.exception, AgentUnavailable)
        with self.assertLogs("embcache", "WARNING"):
            self.assertIs(degrade.get_or_compute(key, lambda: VALUE, "r1"), VALUE)
        # Keys need no NATS: the agent still makes them.
        self.assertEqual(strict.key_from_raw_bytes(harness.config(), b"nats down"), key)


class EpisodeTest(unittest.TestCase):
    def test_a_flapping_store_logs_once(self):
        # Under a store outage, local hits succeed between failures: one
        # line, not one per pair of calls.
        ep = embcache._degrade.Policy()
        with self.assertLogs("embcache", "WARNING") as logs:
            for _ in range(20):
                ep.failed("get", RuntimeError("store unavailable"))
                ep.ok()
        self.assertEqual(len(logs.records), 1, [r.getMessage() for r in logs.records])
        self.assertEqual(ep.total, 20)
        with mock.patch.object(embcache._degrade, "_QUIET", 0.0), self.assertLogs("embcache", "WARNING") as logs:
            ep.failed("get", RuntimeError("again"))
            ep.ok()
        self.assertIn("21 calls were served without it", logs.records[-1].getMessage())

    def test_a_short_outage_logs_its_end(self):
        # The first success comes within the quiet time of the failure's
        # line: the end is logged with the first success after it, not
        # dropped (a new user's walkthrough found it).
        ep = embcache._degrade.Policy()
        with self.assertLogs("embcache", "WARNING") as logs:
            ep.failed("get", RuntimeError("store unavailable"))
            ep.ok()
        self.assertEqual(len(logs.records), 1, [r.getMessage() for r in logs.records])
        with mock.patch.object(embcache._degrade, "_QUIET", 0.0), self.assertLogs("embcache", "WARNING") as logs:
            ep.ok()
        self.assertIn("the cache serves again; 1 calls were served without it", logs.records[-1].getMessage())


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class ReservationTest(harness.ClusterCase):
    """What reserve and commit raise (both modes: they are the low-level
    calls; get_or_compute is the one that degrades)."""

    def test_a_long_wait_lives_on_heartbeats(self):
        # agent_timeout bounds each silence, not the wait: a lookup waits 3 s
        # for another process's compute with agent_timeout=1.
        with EmbeddingCache(self.sock, store_unavailable_mode="strict") as holder, \
                EmbeddingCache(self.sock, store_unavailable_mode="strict", agent_timeout=1.0) as waiter:
            key = holder.key_from_raw_bytes(harness.config(), b"a long compute")
            r = holder.reserve(key, "h")
            timer = threading.Timer(3.0, holder.commit, args=(r, VALUE))
            timer.start()
            t0 = time.monotonic()
            got = waiter.reserve(key, "w")
            self.assertGreater(time.monotonic() - t0, 2.5)
            timer.join()
            self.assertIsInstance(got, Embedding)
            self.assertEqual(got.tobytes(), VALUE.data)
            got.close()
            waiter.cleanup_request("w")

    def test_commit_after_abandon_is_typed(self):
        from embcache import ReservationEnded

        with EmbeddingCache(self.sock) as c:
            key = c.key_from_raw_bytes(harness.config(), b"abandoned")
            r = c.reserve(key, "r1")
            self.assertIsInstance(r, Reservation)
            c.abandon(r, "nope")
            with self.assertRaises(ReservationEnded):
                c.commit(r, VALUE)
            again = c.reserve(key, "r1")
            with self.assertRaises(InvalidValue):
                c.commit(again, [1, 2, 3])  # not a value the cache can hold
            self.assertFalse(again.done)  # nothing was sent: the caller may commit a value, or abandon
            c.commit(again, VALUE)
            hit = c.reserve(key, "r1")
            self.assertIsInstance(hit, Embedding)
            self.assertEqual(hit.tobytes(), VALUE.data)
            hit.close()
            c.cleanup_request("r1")

    def test_a_bad_key_is_raised_not_ridden_out(self):
        # A tenant the agent refuses was a 500 and the client took it for an
        # outage: it computed without the cache and counted a degrade (a
        # helper's hunt found it). A bad request is the caller's bug.
        from embcache import BadRequest, EmbeddingCacheKey

        with EmbeddingCache(self.sock) as c:
            bad = EmbeddingCacheKey(key="c" * 64, tenant="a.b")
            calls = []
            with self.assertRaises(BadRequest):
                c.get_or_compute(bad, lambda: calls.append(1) or VALUE, "r")
            with self.assertRaises(BadRequest):
                c.get(bad, "r")
            self.assertEqual(calls, [])
            self.assertEqual(c.degraded, 0)


if __name__ == "__main__":
    logging.basicConfig()
    unittest.main()
