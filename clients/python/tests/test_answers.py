"""The client's check of answers, against a fake agent on a Unix socket
that answers with another call's, key's, request's or reservation's answer:
each is refused with AnswerMismatch, never taken as a value. And what a
forked child does with an inherited client before its first call. No NATS
here: these test the client's side of the wire."""

import json
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

from embcache import (AgentTimeout, AnswerMismatch, APIError, EmbeddingCache, EmbeddingCacheKey, EncoderPreprocessingConfig,
                      Reservation, StoreFull, Tensor, Tokens, UntrustedAgent)

from .test_fork import fork_call, join_child

KEY = EmbeddingCacheKey(key="ab" * 32, tenant="acme", model="m", weight_epoch=3)
OTHER_KEY = "cd" * 32


class FakeAgent:
    """A Unix-socket HTTP/1.1 server answering each call with
    answer(path, body) -> (status, body dict or None, call header or None);
    the call header defaults to an echo of the request's, as the agent's."""

    def __init__(self, answer):
        self.dir = tempfile.mkdtemp(prefix="embcache-fake-")
        self.path = os.path.join(self.dir, "agent.sock")
        self.answer = answer
        self.connections = 0
        self.calls = []  # (path, body)
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                fake.connections += 1
                while self.serve_one():
                    pass

            def serve_one(self) -> bool:
                line = self.rfile.readline()
                if not line:
                    return False  # the client closed the connection
                path = line.split()[1].decode()
                headers = {}
                while True:
                    h = self.rfile.readline().strip()
                    if not h:
                        break
                    name, _, value = h.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                raw = self.rfile.read(int(headers.get("content-length", 0)))
                body = json.loads(raw) if raw and headers.get("content-type") == "application/json" else raw
                fake.calls.append((path, body))
                status, answer, call = fake.answer(path, body)
                call = headers.get("embcache-call") if call is None else call
                data = json.dumps(answer).encode() if answer is not None else b""
                head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(data)}\r\n"
                if call:
                    head += f"Embcache-Call: {call}\r\n"
                self.wfile.write(head.encode() + b"\r\n" + data)
                return True

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True
            block_on_close = False

        self.server = Server(self.path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)


def lookup_answer(body, **over):
    """The agent's reserved answer to a lookup body, with over changed."""
    answer = {"status": "reserved", "reservation": "res-1", "key": body["key"], "tenant": body["tenant"],
              "model": body["model"], "weight_epoch": body["weight_epoch"], "client": body["client"],
              "request_id": body["request_id"]}
    answer.update(over)
    return answer


class AnswerCheckTest(unittest.TestCase):
    def agent(self, answer) -> FakeAgent:
        fake = FakeAgent(answer)
        self.addCleanup(fake.close)
        return fake

    def client(self, fake, **kw) -> EmbeddingCache:
        kw.setdefault("store_unavailable_mode", "strict")
        cache = EmbeddingCache(fake.path, agent_timeout=10, **kw)
        self.addCleanup(cache.close)
        return cache

    def test_matching_answer_is_taken(self):
        fake = self.agent(lambda path, body: (200, lookup_answer(body), None))
        got = self.client(fake).reserve(KEY, "r1")
        self.assertIsInstance(got, Reservation)
        self.assertEqual(got.id, "res-1")

    def test_lookup_answered_for_another_key(self):
        for name, value in [("key", OTHER_KEY), ("tenant", "other"), ("model", "m2"), ("weight_epoch", 4)]:
            with self.subTest(name):
                fake = self.agent(lambda path, body: (200, lookup_answer(body, **{name: value}), None))
                cache = self.client(fake)
                with self.assertRaises(AnswerMismatch) as e:
                    cache.reserve(KEY, "r1")
                self.assertIn(name, str(e.exception))
                # The connection the answer came on was closed (the agent
                # gives back what it held): the next call opens another.
                with self.assertRaises(AnswerMismatch):
                    cache.reserve(KEY, "r1")
                self.assertEqual(fake.connections, 2)

    def test_hit_for_another_key_is_not_mapped(self):
        # A hit naming another key is refused before its file is touched.
        fake = self.agent(lambda path, body: (200, lookup_answer(body, status="hit", key=OTHER_KEY, value={
            "file": "/nonexistent", "offset": 0, "length": 4, "kind": "tensor", "dtype": "uint8", "shape": [4],
            "checksum": "00"}), None))
        with self.assertRaises(AnswerMismatch):
            self.client(fake).reserve(KEY, "r1")

    def test_lookup_answered_for_another_request_or_client(self):
        for over in ({"request_id": "r2"}, {"client": "py-1-other"}, {"request_id": None}):
            with self.subTest(over):
                fake = self.agent(lambda path, body: (200, lookup_answer(body, **over), None))
                with self.assertRaises(AnswerMismatch):
                    self.client(fake).reserve(KEY, "r1")

    def test_answer_to_another_call(self):
        # A key answer names no key the client knows beforehand: only the
        # call it answers tells it from another input's key.
        answer = {"key": OTHER_KEY, "tenant": "acme", "mode": "raw-bytes"}
        for call in ("0123456789abcdef.1", ""):  # another connection's call; none (an agent older than the echo)
            with self.subTest(call=call):
                fake = self.agent(lambda path, body: (200, answer, call))
                cfg = EncoderPreprocessingConfig(model_id="m", model_revision="r", encoder_config_hash="h",
                                                 processor_version="p", modality="image", tenant="acme")
                with self.assertRaises(AnswerMismatch):
                    self.client(fake).key_from_raw_bytes(cfg, b"jpeg")

    def test_error_answer_to_another_call(self):
        fake = self.agent(lambda path, body: (404, {"error": "unknown reservation", "code": "not_found"}, "x.1"))
        with self.assertRaises(AnswerMismatch):
            self.client(fake).abandon(Reservation(None, KEY, "res-1", "r1"))

    def test_a_refused_abandon_closes_the_reservations_connection(self):
        # The agent did not take the abandon (a 500): the connection holding
        # the reservation is closed, not pooled, so the agent ends it now
        # rather than at the compute timeout.
        def answer(path, body):
            if path == "/v1/lookup":
                return 200, lookup_answer(body), None
            return 500, {"error": "boom", "code": "internal"}, None

        fake = self.agent(answer)
        cache = self.client(fake)
        got = cache.reserve(KEY, "r1")
        conn = got.conn
        with self.assertRaises(APIError):
            cache.abandon(got, "encoder OOM")
        self.assertTrue(conn.closed)
        self.assertTrue(got.done)
        self.assertEqual(cache.open_connections(), 0)

    def test_a_with_block_abandons_with_its_reason(self):
        # The reason the agent tells the key's waiters: the exception that
        # left the block, or the commit's failure.
        def answer(path, body):
            if path == "/v1/lookup":
                return 200, lookup_answer(body), None
            if path == "/v1/abandon":
                return 204, None, None
            return 503, {"error": "no room", "code": "no_space"}, None

        fake = self.agent(answer)
        cache = self.client(fake)
        with self.assertRaises(ZeroDivisionError):
            with cache.reserve(KEY, "r1"):
                1 / 0
        with cache.reserve(KEY, "r1") as got:
            with self.assertRaises(StoreFull):
                got.commit(Tokens([1, 2]))
        with cache.reserve(KEY, "r1"):
            pass
        reasons = [body["reason"] for path, body in fake.calls if path == "/v1/abandon"]
        self.assertEqual(reasons, ["ZeroDivisionError: division by zero",
                                   "commit failed: StoreFull: agent: 503 no_space: no room", "not committed"])

    def test_an_abandon_waits_for_the_commit_in_flight(self):
        # A cancelled asyncio task, or a publisher's drop, abandons from
        # another thread: it waits for the commit on the same connection,
        # then finds the reservation ended and sends nothing.
        committing = threading.Event()

        def answer(path, body):
            if path == "/v1/lookup":
                return 200, lookup_answer(body), None
            if path == "/v1/commit":
                committing.set()
                time.sleep(0.3)
                return 200, {"status": "hit", "reservation": body["reservation"], "key": KEY.key,
                             "tenant": KEY.tenant, "model": KEY.model, "weight_epoch": KEY.weight_epoch,
                             "client": body["client"], "request_id": body["request_id"]}, None
            return 204, None, None

        fake = self.agent(answer)
        got = self.client(fake).reserve(KEY, "r1")
        errors = []

        def commit():
            try:
                got.commit(Tokens([1, 2]))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t = threading.Thread(target=commit)
        t.start()
        self.assertTrue(committing.wait(10))
        got.abandon("the caller was cancelled")
        t.join(10)
        self.assertEqual(errors, [])
        self.assertTrue(got.done)
        self.assertNotIn("/v1/abandon", [p for p, _ in fake.calls])

    def test_slot_of_another_reservation_is_not_written(self):
        slot_file = os.path.join(tempfile.mkdtemp(prefix="embcache-slot-"), "slot")
        self.addCleanup(shutil.rmtree, os.path.dirname(slot_file))
        open(slot_file, "wb").close()

        fake = self.agent(lambda path, body: (200, {"reservation": "res-2", "slot": "s", "file": slot_file,
                                                    "size": body["size"]}, None))
        with self.assertRaises(AnswerMismatch):
            self.client(fake).commit(Reservation(None, KEY, "res-1", "r1"), Tensor(b"abcd", "uint8", (4,)))
        self.assertEqual(os.path.getsize(slot_file), 0)
        self.assertNotIn("/v1/commit", [p for p, _ in fake.calls])

    def test_commit_answered_for_another_reservation(self):
        slot_file = os.path.join(tempfile.mkdtemp(prefix="embcache-slot-"), "slot")
        self.addCleanup(shutil.rmtree, os.path.dirname(slot_file))
        open(slot_file, "wb").close()

        def answer(path, body):
            if path == "/v1/slot":
                return 200, {"reservation": body["reservation"], "slot": "s", "file": slot_file, "size": body["size"]}, None
            return 200, {"status": "hit", "reservation": "res-2", "key": KEY.key, "tenant": KEY.tenant, "model": KEY.model,
                         "weight_epoch": KEY.weight_epoch, "client": body["client"], "request_id": body["request_id"]}, None

        with self.assertRaises(AnswerMismatch):
            self.client(self.agent(answer)).commit(Reservation(None, KEY, "res-1", "r1"), Tensor(b"abcd", "uint8", (4,)))

    def test_release_answered_for_another_request(self):
        fake = self.agent(lambda path, body: (200, {"released": 3, "client": body["client"], "request_id": "r2"}, None))
        with self.assertRaises(AnswerMismatch):
            self.client(fake).cleanup_request("r1")

    def test_mismatch_is_never_a_value(self):
        # In strict mode a mismatch is raised; in degrade mode the request
        # gets its own compute (counted): in neither does it get the answer.
        fake = self.agent(lambda path, body: (200, lookup_answer(body, key=OTHER_KEY), None))
        with self.assertRaises(AnswerMismatch):
            self.client(fake).get_or_compute(KEY, lambda: "computed", "r1")
        degrade = self.client(fake, store_unavailable_mode="degrade")
        with self.assertLogs("embcache", "WARNING"):
            self.assertEqual(degrade.get_or_compute(KEY, lambda: "computed", "r1"), "computed")
        self.assertEqual(degrade.degraded, 1)


class IdentityTest(unittest.TestCase):
    def test_forked_child_disowns_the_parent_connection(self):
        fake = FakeAgent(lambda path, body: (200, {"released": 0, "client": body["client"],
                                                   "request_id": body["request_id"]}, None))
        self.addCleanup(fake.close)
        cache = EmbeddingCache(fake.path, store_unavailable_mode="strict", client_id="encoder")
        self.addCleanup(cache.close)
        cache.cleanup_request("r1")
        inherited = cache._state.pool.idle[0].sock.fileno()

        def child():
            # Before any call: the at-fork hook has closed the child's copy
            # of the parent's socket, and given the child its own identity.
            try:
                os.fstat(inherited)
                still_open = True
            except OSError:
                still_open = False
            before = cache.client_id
            cache.cleanup_request("r1")
            return {"inherited_open": still_open, "client": before, "after": cache.client_id}

        got = join_child(*fork_call(child))
        self.assertFalse(got["inherited_open"])
        self.assertTrue(got["client"].startswith("encoder-"), got)
        self.assertNotEqual(got["client"], "encoder")
        self.assertEqual(got["after"], got["client"])
        # The parent keeps its name and its connection: no new one was opened for it.
        self.assertEqual(cache.client_id, "encoder")
        cache.cleanup_request("r2")
        self.assertEqual(fake.connections, 2)  # the parent's, then the child's
        self.assertEqual([b["client"] for _, b in fake.calls], ["encoder", got["client"], "encoder"])

    def test_pickled_copy_has_its_own_identity(self):
        import pickle

        cache = EmbeddingCache("/nonexistent.sock", store_unavailable_mode="strict", compute_timeout=7,
                               agent_timeout=2, client_id="stage")
        copy = pickle.loads(pickle.dumps(cache))
        # In this process a copy keeps the name it was given; settings travel.
        self.assertEqual((copy.client_id, copy.strict, copy.compute_timeout, copy.agent_timeout), ("stage", True, 7, 2))

        def child():
            return pickle.loads(pickle.dumps(cache)).client_id

        self.assertTrue(join_child(*fork_call(child)).startswith("stage-"))


if __name__ == "__main__":
    unittest.main()


NOBODY = 65534


class UntrustedAgentTest(unittest.TestCase):
    """A process of another user listening where the agent's socket should
    be (the agent not started, or refused to start: a local user made its
    directory first) gets nothing: the client refuses the connection before
    a byte is sent, raising in strict mode and computing in degrade mode.
    Trusted by agent_uid, it is called."""

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root, to run a process as another user")
        d = tempfile.mkdtemp(prefix="embcache-squat-")
        self.addCleanup(shutil.rmtree, d, True)
        os.chown(d, NOBODY, NOBODY)
        self.path = os.path.join(d, "agent.sock")
        code = textwrap.dedent("""
            import socket, sys
            s = socket.socket(socket.AF_UNIX)
            s.bind(sys.argv[1])
            s.listen(8)
            print("listening", flush=True)
            held = []
            while True:
                held.append(s.accept()[0])  # reads nothing, answers nothing
            """)
        p = subprocess.Popen([sys.executable, "-c", code, self.path], user=NOBODY, group=NOBODY, extra_groups=[],
                             stdout=subprocess.PIPE, text=True)
        self.addCleanup(p.stdout.close)
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        self.assertEqual(p.stdout.readline(), "listening\n")

    def test_another_users_process_gets_nothing(self):
        strict = EmbeddingCache(self.path, store_unavailable_mode="strict", agent_timeout=2.0)
        self.addCleanup(strict.close)
        with self.assertRaisesRegex(UntrustedAgent, f"runs as uid {NOBODY}"):
            strict.get(KEY, "r1")
        degrade = EmbeddingCache(self.path, agent_timeout=2.0)
        self.addCleanup(degrade.close)
        self.assertEqual(degrade.get_or_compute(KEY, lambda: "computed", "r2"), "computed")

    def test_agent_uid_trusts_it(self):
        trusting = EmbeddingCache(self.path, store_unavailable_mode="strict", agent_timeout=0.5, agent_uid=NOBODY)
        self.addCleanup(trusting.close)
        with self.assertRaises(AgentTimeout):  # connected and asked: it answers nothing
            trusting.get(KEY, "r1")

    def test_agent_uid_must_be_a_user_id(self):
        for bad in (-1, 1 << 32, "65534", True, 1.5):
            with self.assertRaises(ValueError):
                EmbeddingCache(self.path, agent_uid=bad)

    def test_a_client_pickled_before_agent_uid_loads(self):
        state = EmbeddingCache(self.path, agent_uid=NOBODY).__getstate__()
        del state["_trusted_uids"]  # as a client of an earlier version pickled it
        old = EmbeddingCache.__new__(EmbeddingCache)
        old.__setstate__(state)
        self.addCleanup(old.close)
        self.assertEqual(old._trusted_uids, frozenset())
