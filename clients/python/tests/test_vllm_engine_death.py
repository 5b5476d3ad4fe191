"""An engine that dies holding an item's reservation holds nobody up: the
agent gives the reservation back when the engine's process exits (its
connection closes), and another engine, on another node, whose lookup
was waiting for the item, is handed the compute at once, not after the
compute timeout."""

import os
import signal
import subprocess
import sys
import time
import unittest
from types import SimpleNamespace

from tests.harness import HERE, PYTHON_DIR, ClusterCase, optional
from tests.test_vllm_connector import request, vllm_config

torch = optional("torch")

# The dying engine: its scheduler reserves the item, says so, and waits to
# be killed (the forward that would compute it never ends).
DYING = """
import sys, time
from tests.test_vllm_connector import request, vllm_config
from embcache.vllm import ECConnectorRole, EmbcacheECConnector
sched = EmbcacheECConnector(vllm_config(sys.argv[1]), ECConnectorRole.SCHEDULER)
req = request("dying", [int(sys.argv[2])], "death")
while not sched.ensure_cache_available(req, 0):
    time.sleep(0.001)
print("reserved" if not sched.has_cache_item(req.mm_features[0].identifier) else "hit", flush=True)
time.sleep(600)
"""


@unittest.skipIf(torch is None, "torch is not installed (make test installs python3-torch)")
class EngineDeathTest(ClusterCase):
    AGENTS = ("n1", "n2")

    def test_a_dead_engines_item_is_computed_by_the_next(self):
        from embcache.vllm import ECConnectorRole, EmbcacheECConnector

        env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.path.dirname(HERE))
        dying = subprocess.Popen([sys.executable, "-c", DYING, self.sock, "1"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=env, cwd=os.path.dirname(HERE))
        try:
            line = dying.stdout.readline().decode().strip()
            self.assertEqual(line, "reserved", dying.stderr.read().decode() if not line else line)
            # Another engine, on the other node, needs the item: it waits.
            sched = EmbcacheECConnector(vllm_config(self.sock2), ECConnectorRole.SCHEDULER)
            try:
                req = request("next", [1], "death")
                deadline = time.monotonic() + 1.0
                while time.monotonic() < deadline:
                    self.assertFalse(sched.ensure_cache_available(req, 0), "decided while the item was held")
                    time.sleep(0.01)
                os.kill(dying.pid, signal.SIGKILL)
                killed = time.monotonic()
                while not sched.ensure_cache_available(req, 0):
                    self.assertLess(time.monotonic() - killed, 10.0, "still waiting 10 s after the holder died")
                    time.sleep(0.005)
                took = time.monotonic() - killed
                self.assertFalse(sched.has_cache_item(req.mm_features[0].identifier), "the next engine computes it")
                self.assertEqual(sched.stats()["reserved"], 1)
                sched.request_finished(req)
                print(f"\nthe next engine was handed the item {took * 1000:.0f} ms after the holder was killed")
            finally:
                sched.shutdown()
        finally:
            if dying.poll() is None:
                dying.kill()
            dying.wait()
            dying.stdout.close()
            dying.stderr.close()


if __name__ == "__main__":
    unittest.main()
