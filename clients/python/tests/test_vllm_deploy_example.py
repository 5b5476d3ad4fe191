"""The vLLM-Omni deploy example (examples/vllm_omni_deploy.yaml) against a
real agent, so that it cannot rot: its stage's `ec_transfer_config` and
`env` are what the connector is built from, and an engine driven as vLLM
drives one (test_vllm_connector.run_engine) computes each item once."""

import os
import queue
import unittest

from tests.harness import PYTHON_DIR, ClusterCase, optional
from tests.test_vllm_connector import PROCESSORS, TP, request, run_engine

torch = optional("torch")
yaml = optional("yaml")

EXAMPLE = os.path.join(PYTHON_DIR, "examples", "vllm_omni_deploy.yaml")


@unittest.skipIf(torch is None or yaml is None, "torch or PyYAML not installed (make test installs both)")
class DeployExampleTest(ClusterCase):
    def test_the_example_stage_runs_the_connector(self):
        with open(EXAMPLE) as f:
            deploy = yaml.safe_load(f)
        (stage,) = deploy["stages"]
        ec = stage["ec_transfer_config"]
        self.assertEqual((ec["ec_connector"], ec["ec_connector_module_path"], ec["ec_role"]),
                         ("EmbcacheECConnector", "embcache.vllm", "ec_both"))
        self.assertEqual(stage["tensor_parallel_size"], TP)
        extra = dict(ec["ec_connector_extra_config"])
        self.assertNotIn("agent_socket", extra, "the example names the socket in the stage's env")
        self.assertEqual(set(stage["env"]), {"EMBCACHE_AGENT_SOCKET"})
        # The stage's env, with this test's agent for the socket; the
        # processors' configs given (transformers is not installed here).
        old = os.environ.get("EMBCACHE_AGENT_SOCKET")
        os.environ["EMBCACHE_AGENT_SOCKET"] = self.sock
        try:
            out = queue.Queue()
            reqs = [request(f"r{i}", [i % 4, (i + 1) % 4], "deploy") for i in range(10)]
            run_engine("deploy", None, reqs, out, extra=dict(extra, processors=PROCESSORS))
            r = out.get(timeout=1)
        finally:
            if old is None:
                os.environ.pop("EMBCACHE_AGENT_SOCKET", None)
            else:
                os.environ["EMBCACHE_AGENT_SOCKET"] = old
        self.assertEqual(r["wrong"], [])
        self.assertEqual(r["sched"]["lookup_failures"], 0, r["sched"])
        self.assertEqual(set(r["forwards"]), {f"deploy-{i:04d}" for i in range(4)})


if __name__ == "__main__":
    unittest.main()
