"""Several processes, two agents, one embedded server: a key is computed
once in the whole cluster, and a process killed while it holds a
reservation hands the key over."""

import hashlib
import json
import os
import signal
import subprocess
import tempfile
import unittest

from . import harness

# A child process: looks the key of INPUT up through the agent at SOCKET
# and, if it must compute, waits for the parent's go-ahead (a line on
# stdin) and commits NAME's bytes; prints what it got.
CHILD = r"""
import hashlib, json, sys
from embcache import EmbeddingCache, Reservation, Tensor
import harness

sock, name, inp, size = sys.argv[1], sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])
cache = EmbeddingCache(sock)
key = cache.key_from_raw_bytes(harness.config(), inp)
got = cache.reserve(key, "req-" + name)
computed = isinstance(got, Reservation)
if computed:
    print(json.dumps({"reserved": True}), flush=True)
    if sys.stdin.readline().strip() != "commit":
        sys.exit(3)
    cache.commit(got, Tensor(name.encode()[:1] * size, "uint8", (size,)))
    got = cache.reserve(key, "req-" + name)  # the value as the agent stores it
data = got.buffer
print(json.dumps({"computed": computed, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                  "path": got.path}), flush=True)
got.close()
cache.cleanup_request("req-" + name)
"""

SIZE = 1 << 20


class MultiProcessTest(unittest.TestCase):
    def setUp(self):
        self.cluster = harness.Cluster()
        self.addCleanup(self.cluster.close)
        self.sock1 = self.cluster.agent("n1")
        self.sock2 = self.cluster.agent("n2")

    def go_get(self, sock, inp, tag):
        """The Go process: `embcache agent get`, committing tag's bytes if it computes."""
        d = tempfile.mkdtemp(dir=self.cluster.dir)
        paths = {n: os.path.join(d, n) for n in ("config", "raw", "value")}
        with open(paths["config"], "w") as f:
            json.dump(harness.config().to_wire(), f)
        with open(paths["raw"], "wb") as f:
            f.write(inp)
        with open(paths["value"], "wb") as f:
            f.write(tag * SIZE)
        return subprocess.Popen([self.cluster.bin, "agent", "get", "--socket", sock, "--config", paths["config"],
                                 "--raw", paths["raw"], "--value", paths["value"], "--dtype", "uint8",
                                 "--shape", str(SIZE), "--request", "go-req"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def stats(self, sock):
        from embcache import EmbeddingCache

        with EmbeddingCache(sock) as c:
            return c.stats()

    def test_two_python_one_go_compute_once(self):
        inp = b"one image, three processes"
        a = harness.python_child(CHILD, self.sock1, "A", inp.decode(), str(SIZE))
        self.addCleanup(harness.close_child, a)
        first = harness.read_json_line(a)
        self.assertEqual(first, {"reserved": True})  # A holds the key; the others must wait
        b = harness.python_child(CHILD, self.sock2, "B", inp.decode(), str(SIZE))
        self.addCleanup(harness.close_child, b)
        g = self.go_get(self.sock2, inp, b"G")
        self.addCleanup(harness.close_child, g)
        # Both are waiting on agent n2 (one for the Python child, one for Go).
        harness.wait_until(lambda: self.stats(self.sock2)["agent"]["lookups"] >= 2, what="two waiters")
        a.stdin.write(b"commit\n")
        a.stdin.flush()
        results = [harness.read_json_line(a), harness.read_json_line(b)]
        out, err = g.communicate(timeout=30)
        self.assertEqual(g.returncode, 0, err.decode())
        results.append(json.loads(out))
        for p in (a, b):
            p.stdin.close()
            self.assertEqual(p.wait(10), 0, p.stderr.read().decode())
        self.assertEqual([r["computed"] for r in results], [True, False, False])
        want = hashlib.sha256(b"A" * SIZE).hexdigest()
        self.assertEqual({r["sha256"] for r in results}, {want}, results)
        self.assertEqual({r["bytes"] for r in results}, {SIZE})
        s1, s2 = self.stats(self.sock1), self.stats(self.sock2)
        self.assertEqual(s1["cache"]["Computes"] + s2["cache"]["Computes"], 1)

    def test_killed_holder_hands_over(self):
        inp = b"the holder dies"
        holder = harness.python_child(CHILD, self.sock1, "H", inp.decode(), str(SIZE))
        self.addCleanup(harness.close_child, holder)
        self.assertEqual(harness.read_json_line(holder), {"reserved": True})
        waiter = harness.python_child(CHILD, self.sock2, "W", inp.decode(), str(SIZE))
        self.addCleanup(harness.close_child, waiter)
        harness.wait_until(lambda: self.stats(self.sock2)["cache"]["Waits"] >= 1, what="the waiter waiting")
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        # The agent saw the connection close and abandoned the lease: the
        # waiter is handed the key at once (not after the lease TTL).
        self.assertEqual(harness.read_json_line(waiter, timeout=15), {"reserved": True})
        waiter.stdin.write(b"commit\n")
        waiter.stdin.flush()
        got = harness.read_json_line(waiter)
        waiter.stdin.close()
        self.assertEqual(waiter.wait(10), 0, waiter.stderr.read().decode())
        self.assertTrue(got["computed"])
        self.assertEqual(got["sha256"], hashlib.sha256(b"W" * SIZE).hexdigest())
        agent1 = self.stats(self.sock1)["agent"]
        self.assertEqual(agent1["disconnect_cleanups"], 1)
        self.assertEqual(agent1["reservations"], 0)
        self.assertEqual(agent1["slots"], 0)


if __name__ == "__main__":
    unittest.main()
