"""The example hook (examples/vllm_omni_hook.py) against a real agent, with
a stand-in encoder, so that the example cannot rot: with the cache on, the
encoder runs once per distinct item and every item gets what the encoder
computes for it; with the cache off (or the agent down, in degrade mode) the
encoder runs for every item and the agent is not asked.

Values are torch tensors when torch is importable, numpy arrays otherwise,
and embcache.Tensor (compared by bytes) without either."""

import array
import collections
import importlib.util
import logging
import os
import unittest

from embcache import AgentUnavailable, Embedding, Tensor

from . import harness

torch = harness.optional("torch")
np = harness.optional("numpy")

EXAMPLE = os.path.join(harness.PYTHON_DIR, "examples", "vllm_omni_hook.py")
N = 64  # values per item: the encoder maps them to a (4, 16) embedding


def load_example():
    spec = importlib.util.spec_from_file_location("embcache_example_vllm_omni_hook", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Backend:
    """Inputs, the stand-in encoder's arithmetic and comparisons in torch,
    numpy or plain Python (Tensor values)."""

    def __init__(self, dtype="float32"):
        self.name = "torch" if torch is not None else "numpy" if np is not None else "python"
        self.dtype = dtype

    def input(self, item: int):
        """The preprocessed input of item: a fresh object on every call, as
        each request carries its own copy of a repeated image."""
        values = [float(item * 1000 + j) for j in range(N)]
        if self.name == "torch":
            return torch.tensor(values, dtype=torch.float32)
        if self.name == "numpy":
            return np.array(values, dtype=np.float32)
        return array.array("f", values)

    def fingerprint(self, x) -> bytes:
        if self.name == "torch":
            return x.numpy().tobytes()
        return x.tobytes()

    def encode(self, x):
        """What the encoder computes: x * 0.5 - 3 as a (4, 16) tensor."""
        if self.name == "torch":
            return (x * 0.5 - 3).reshape(4, 16).to(getattr(torch, self.dtype))
        if self.name == "numpy":
            return (x * np.float32(0.5) - np.float32(3)).reshape(4, 16).astype(self.dtype)
        return Tensor(array.array("f", [v * 0.5 - 3 for v in x]).tobytes(), "float32", (4, 16))

    def assert_equal(self, test, got, want):
        if self.name == "torch":
            test.assertIsInstance(got, torch.Tensor)
            test.assertEqual(got.dtype, want.dtype)
            test.assertEqual(got.device.type, "cpu")
            test.assertTrue(torch.equal(got, want), f"{got} != {want}")
        elif self.name == "numpy":
            test.assertIsInstance(got, np.ndarray)
            test.assertEqual(got.dtype, want.dtype)
            test.assertTrue(np.array_equal(got, want), f"{got} != {want}")
        else:
            if isinstance(got, Embedding):
                test.assertEqual((got.dtype, got.shape, got.tobytes()), (want.dtype, tuple(want.shape), want.data))
            else:
                test.assertEqual(got, want)


class CountingEncoder:
    """The stand-in encoder: counts its calls per input."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.calls = collections.Counter()

    def __call__(self, x):
        self.calls[self.backend.fingerprint(x)] += 1
        return self.backend.encode(x)


def stage(sock: str, enabled: bool = True, mode: str = "degrade") -> dict:
    return {"embedding_cache": {"enable_embedding_cache": enabled, "agent_socket": sock,
                                "store_unavailable_mode": mode}}


class ExampleHookTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.example = load_example()
        cls.cluster = harness.Cluster()
        cls.sock = cls.cluster.agent("n1")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def hook(self, stage_config, tenant="acme", device=None):
        h = self.example.EmbcacheEncoderHook(stage_config, harness.config(tenant=tenant), device)
        self.addCleanup(h.cache.close)
        return h

    def batch(self, backend, items, tag):
        """raw items (an item's bytes name it: duplicates repeat them) and
        fresh inputs, in the order of items."""
        raw = [f"{tag}-image-{i}".encode() for i in items]
        return raw, [backend.input(i) for i in items]

    def run_enabled(self, dtype, tag, device=None):
        backend = Backend(dtype)
        hook = self.hook(stage(self.sock), device=device)
        self.assertTrue(hook.cache.enabled)
        items = [0, 1, 0, 2, 1, 0, 3]  # four distinct items, three repeated
        raw, inputs = self.batch(backend, items, tag)
        encoder = CountingEncoder(backend)
        pinned = hook.cache.stats()["cache"]["Local"]["Pinned"]

        # Two requests in one batch, as a scheduler mixes them.
        reqs = [f"{tag}-r1"] * 4 + [f"{tag}-r2"] * 3
        out = hook.encode_items(raw, inputs, encoder, reqs)
        self.assertEqual(len(out), len(items))
        self.assertEqual(dict(encoder.calls), {backend.fingerprint(backend.input(i)): 1 for i in set(items)})
        for i, got in zip(items, out):
            backend.assert_equal(self, got, backend.encode(backend.input(i)))

        # A later request with the same items: all hits, the encoder not run.
        encoder.calls.clear()
        again = hook.encode_items(raw, [backend.input(i) for i in items], encoder, [f"{tag}-r3"] * len(items))
        self.assertEqual(sum(encoder.calls.values()), 0)
        for i, got in zip(items, again):
            backend.assert_equal(self, got, backend.encode(backend.input(i)))

        # finish_request unpins what its request looked up (each request
        # above has hits: how many pins a hit holds is the client's business).
        self.assertGreater(hook.cache.stats()["cache"]["Local"]["Pinned"], pinned)
        for req in ("r1", "r2", "r3"):
            self.assertGreaterEqual(hook.finish_request(f"{tag}-{req}"), 1, req)
            self.assertEqual(hook.finish_request(f"{tag}-{req}"), 0, req)
        self.assertEqual(hook.cache.stats()["cache"]["Local"]["Pinned"], pinned)
        # The tensors stay valid after their request ended (the mapping outlives the pin).
        for i, got in zip(items, out):
            backend.assert_equal(self, got, backend.encode(backend.input(i)))

    def test_enabled(self):
        self.run_enabled("float32", "f32")

    @unittest.skipIf(torch is None, "bfloat16 needs torch")
    def test_enabled_bfloat16_on_device(self):
        self.run_enabled("bfloat16", "bf16", device="cpu")

    def test_disabled(self):
        backend = Backend()
        # Strict, and no agent at the socket: a call to the agent would raise.
        missing = os.path.join(self.cluster.dir, "no-agent.sock")
        hook = self.hook(stage(missing, enabled=False, mode="strict"))
        self.assertFalse(hook.cache.enabled)
        items = [0, 1, 0, 2]
        raw, inputs = self.batch(backend, items, "off")
        outputs = []

        def encoder(x):
            outputs.append(backend.encode(x))
            return outputs[-1]

        out = hook.encode_items(raw, inputs, encoder, ["off-r1"] * len(items))
        self.assertEqual(hook.finish_request("off-r1"), 0)
        # Every item encoded, duplicates too; each output the encoder's own object.
        self.assertEqual(len(outputs), len(items))
        for i, got, own in zip(items, out, outputs):
            self.assertIs(got, own)
            backend.assert_equal(self, got, backend.encode(backend.input(i)))

    def test_agent_down(self):
        backend = Backend()
        missing = os.path.join(self.cluster.dir, "no-agent.sock")
        items = [0, 1, 0]
        raw, inputs = self.batch(backend, items, "down")
        encoder = CountingEncoder(backend)
        hook = self.hook(stage(missing))
        logging.disable(logging.WARNING)  # the client's "serving without the cache" line
        self.addCleanup(logging.disable, logging.NOTSET)
        out = hook.encode_items(raw, inputs, encoder, ["down-r1"] * len(items))
        self.assertEqual(sum(encoder.calls.values()), len(items))  # degrade: computed locally, every item
        for i, got in zip(items, out):
            backend.assert_equal(self, got, backend.encode(backend.input(i)))
        strict = self.hook(stage(missing, mode="strict"))
        with self.assertRaises(AgentUnavailable):
            strict.encode_items(raw, inputs, encoder, ["down-r2"] * len(items))

    def test_example_main(self):
        """The example's own sketch (the cache off) runs."""
        import contextlib
        import io
        import runpy

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            runpy.run_path(EXAMPLE, run_name="__main__")
        self.assertIn("Tensor(", buf.getvalue())


if __name__ == "__main__":
    unittest.main()
