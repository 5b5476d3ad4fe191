"""One client, many processes and threads, against a real agent: a client
made in a parent and used in children made by os.fork() and by each of
multiprocessing's start methods (fork, spawn, forkserver), and from threads.
Every value any of them gets is checked against its input's true bytes
(derived from the input alone), so an answer to another call, key or
process cannot pass for a value."""

import hashlib
import json
import multiprocessing
import os
import random
import select
import signal
import threading
import time
import traceback
import unittest

from embcache import Embedding, EmbeddingCache, Reservation, Tensor

from . import harness

INPUTS = 12  # inputs per test; every worker looks each of them up ROUNDS times
ROUNDS = 2
SIZE = 4096  # bytes per value


def inputs(salt: str) -> list:
    """The test's inputs: a salt per test, so that each test computes its
    values afresh (computes, waits and hits all happen) instead of only
    hitting another test's."""
    return [f"{salt}-image-{i:02d}".encode() for i in range(INPUTS)]


def true_bytes(inp: bytes) -> bytes:
    """The value of an input, from the input alone: any process can check
    what it got."""
    seed = hashlib.sha256(inp).digest()
    return seed * (SIZE // len(seed))


def exercise(cache: EmbeddingCache, worker: str, salt: str, rounds: int = ROUNDS) -> dict:
    """Keys and looks up every input of salt, rounds times, in an order of
    worker's own, computing what nobody has yet; checks every value's
    bytes. Returns what it did."""
    cfg = harness.config()
    order = inputs(salt)
    random.Random(worker).shuffle(order)
    checked = computed = 0
    for n in range(rounds):
        request = f"{worker}-round{n}"
        for inp in order:
            key = cache.key_from_raw_bytes(cfg, inp)
            emb = cache.get_or_compute(key, lambda: Tensor(true_bytes(inp), "uint8", (SIZE,)), request)
            if isinstance(emb, Tensor):  # this process computed it: its own value comes back
                computed += 1
                got = bytes(emb.data)
            elif isinstance(emb, Embedding):
                got = emb.tobytes()
                emb.close()
            else:
                raise AssertionError(f"{worker}: {inp!r} came back as {emb!r}")
            if got != true_bytes(inp):
                raise AssertionError(f"{worker}: {inp!r} (key {key.key}) came back with other bytes")
            checked += 1
        cache.cleanup_request(request)
    return {"worker": worker, "pid": os.getpid(), "client": cache.client_id, "checked": checked, "computed": computed}


def fork_call(fn) -> tuple:
    """Runs fn() in a child made by os.fork(); returns (pid, fd) for
    join_child. The child reports on a pipe and leaves with os._exit: it
    never returns into the test runner it is a copy of."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            try:
                report, code = {"result": fn()}, 0
            except BaseException:
                report = {"error": traceback.format_exc()}
            os.write(w, json.dumps(report).encode())
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def join_child(pid: int, fd: int, timeout: float = 120.0):
    """fn's result in the child, or AssertionError with its traceback."""
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:  # read to EOF before waiting: a report may outgrow the pipe
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"child {pid} did not finish in {timeout}s")
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
    report = json.loads(b"".join(chunks) or b"{}")
    if "result" not in report or os.waitstatus_to_exitcode(status) != 0:
        raise AssertionError(f"child {pid} (status {status}): {report.get('error', report)}")
    return report["result"]


def _mp_worker(cache, worker, salt, results):
    """A multiprocessing child: the client came from the parent (inherited
    with fork, pickled with spawn and forkserver)."""
    try:
        results.put({"result": exercise(cache, worker, salt)})
    except BaseException:
        results.put({"error": f"{worker}: {traceback.format_exc()}"})
    finally:
        cache.close()


class ForkTest(harness.ClusterCase):
    def client(self) -> EmbeddingCache:
        # strict: an agent error surfaces instead of a local compute; a
        # bounded timeout: a call that never gets its answer fails the test.
        cache = EmbeddingCache(self.sock, store_unavailable_mode="strict", compute_timeout=60)
        self.addCleanup(cache.close)
        return cache

    def check_results(self, results, parent_client):
        clients = [r["client"] for r in results]
        self.assertEqual(len(set(clients)), len(clients), "processes share a client id")
        self.assertNotIn(parent_client, clients)
        for r in results:
            self.assertEqual(r["checked"], INPUTS * ROUNDS, r)

    def test_os_fork(self):
        """Children of os.fork() use the parent's client while the parent
        keeps using it: each gets its own inputs' values, under an identity
        of its own, and the parent's connection (and its pins) outlive them."""
        cache, salt = self.client(), "os-fork"
        parent_client = cache.client_id
        exercise(cache, "parent", salt, rounds=1)  # the parent's connection is open and used at fork()
        held = cache.key_from_raw_bytes(harness.config(), b"os-fork-held")
        cache.get_or_compute(held, lambda: Tensor(true_bytes(b"os-fork-held"), "uint8", (SIZE,)), "held")
        cache.reserve(held, "held").close()  # pinned for "held" (a commit pins nothing)
        children = [fork_call(lambda i=i: exercise(cache, f"child{i}", salt)) for i in range(4)]
        parent = exercise(cache, "parent-during", salt)  # concurrently with the children, on the same socket
        results = [join_child(pid, fd) for pid, fd in children]
        self.check_results(results, parent_client)
        self.assertEqual(parent["client"], parent_client)
        self.assertEqual(parent["checked"], INPUTS * ROUNDS)
        # Had a child ended the parent's connection (a shutdown of the
        # shared socket, say), the agent would have dropped its pin.
        self.assertEqual(cache.cleanup_request("held"), 1)

    def test_fork_while_another_thread_waits_in_a_call(self):
        """fork() while a thread of the parent is inside a call (holding its
        connection's lock, waiting for the answer): the child works on
        connections of its own, and the parent's waiting call gets its answer
        after the child has gone."""
        cache, salt = self.client(), "fork-thread"
        held_input = b"fork-thread-held"
        held = cache.key_from_raw_bytes(harness.config(), held_input)
        reservation = cache.reserve(held, "holder")
        self.assertIsInstance(reservation, Reservation)
        lookups = cache.stats()["agent"]["lookups"]
        got = {}

        def wait_for_value():
            try:
                got["value"] = cache.reserve(held, "waiter")
            except BaseException as e:  # reported by the assertions below
                got["error"] = e

        waiter = threading.Thread(target=wait_for_value)
        waiter.start()
        harness.wait_until(lambda: cache.stats()["agent"]["lookups"] > lookups, what="the waiter's lookup")
        pid, fd = fork_call(lambda: exercise(cache, "child", salt))
        result = join_child(pid, fd)
        self.assertEqual(result["checked"], INPUTS * ROUNDS)
        self.assertNotEqual(result["client"], cache.client_id)
        self.assertTrue(waiter.is_alive())  # still waiting: the child's exit did not disturb its connection
        cache.commit(reservation, Tensor(true_bytes(held_input), "uint8", (SIZE,)))
        waiter.join(30)
        self.assertNotIn("error", got)
        self.assertIsInstance(got["value"], Embedding)
        self.assertEqual(got["value"].tobytes(), true_bytes(held_input))
        got["value"].close()
        cache.cleanup_request("holder")
        cache.cleanup_request("waiter")

    def run_start_method(self, method: str, workers: int = 3):
        try:
            ctx = multiprocessing.get_context(method)
        except ValueError:
            self.skipTest(f"start method {method} not available here")
        cache, salt = self.client(), "mp-" + method
        parent_client = cache.client_id
        exercise(cache, "parent", salt, rounds=1)
        results = ctx.Queue()
        procs = [ctx.Process(target=_mp_worker, args=(cache, f"{method}{i}", salt, results)) for i in range(workers)]
        for p in procs:
            p.start()
        try:
            parent = exercise(cache, "parent-during", salt)
            reports = [results.get(timeout=120) for _ in procs]
        finally:
            for p in procs:
                p.join(30)
                if p.exitcode is None:
                    p.kill()
                    p.join()
        errors = [r["error"] for r in reports if "error" in r]
        self.assertEqual(errors, [])
        self.assertEqual([p.exitcode for p in procs], [0] * workers)
        self.check_results([r["result"] for r in reports], parent_client)
        self.assertEqual(parent["client"], parent_client)
        self.assertEqual(cache.client_id, parent_client)

    def test_multiprocessing_fork(self):
        self.run_start_method("fork")

    def test_multiprocessing_spawn(self):
        self.run_start_method("spawn")

    def test_multiprocessing_forkserver(self):
        self.run_start_method("forkserver")

    def test_threads(self):
        """Threads of one process: one identity, connections from one pool."""
        cache, salt = self.client(), "threads"
        results, errors = [], []

        def worker(i):
            try:
                results.append(exercise(cache, f"thread{i}", salt))
            except BaseException:
                errors.append(traceback.format_exc())

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(len(results), len(threads))
        self.assertEqual({r["client"] for r in results}, {cache.client_id})
        self.assertEqual(sum(r["checked"] for r in results), len(threads) * INPUTS * ROUNDS)


if __name__ == "__main__":
    unittest.main()
