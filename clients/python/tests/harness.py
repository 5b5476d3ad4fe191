"""Starts what the Python tests run against: an embedded NATS server
(`embcache serve`) and node agents (`embcache agent`), real processes of
the binary that `make test` builds ($EMBCACHE_BIN, default bin/embcache)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
PYTHON_DIR = os.path.abspath(os.path.join(HERE, ".."))
VECTORS = os.path.join(ROOT, "cachekey", "testdata", "vectors.json")


def optional(module: str):
    """The module, or None where it is not installed: its tests skip. With
    EMBCACHE_REQUIRE_PYDEPS=1 (.ci/run sets it: make test installs numpy and
    torch) a missing module fails the run instead of skipping its tests."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("EMBCACHE_REQUIRE_PYDEPS") == "1":
            raise
        return None


def process_state(pid: int) -> str:
    """The state letter of a process (R, S, T for stopped, ...)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def binary() -> str:
    path = os.environ.get("EMBCACHE_BIN") or os.path.join(ROOT, "bin", "embcache")
    if not os.access(path, os.X_OK):
        raise unittest.SkipTest(f"{path} not built: run `make build` (make test does)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {timeout}s")
        time.sleep(0.02)


class Cluster:
    """One embedded NATS server and any number of agents, each with its own
    shm directory and payload server (as on nodes of their own)."""

    def __init__(self):
        self.bin = binary()
        self.dir = tempfile.mkdtemp(prefix="embcache-py-")
        shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else self.dir
        self.shm = tempfile.mkdtemp(prefix="embcache-py-", dir=shm_root)
        self.procs = []
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self._start([self.bin, "serve", "--port", str(self.port), "--store-dir", os.path.join(self.dir, "nats"),
                     "--shm-dir", os.path.join(self.shm, "serve"), "--no-reconciler", "--node", "serve"], "serve")

        def nats_up():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_until(nats_up, what="embedded NATS")

    def _start(self, argv, name):
        log = open(os.path.join(self.dir, name + ".log"), "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(p)
        return p

    def agent(self, node: str, *extra: str) -> str:
        sock = os.path.join(self.dir, node + ".sock")
        self._start([self.bin, "agent", "--nats", self.url, "--node", node, "--socket", sock,
                     "--shm-dir", os.path.join(self.shm, node), "--payload-listen", "127.0.0.1:0",
                     "--lease-ttl", "1s", *extra], "agent-" + node)
        wait_until(lambda: healthy(sock), what=f"agent {node}")
        return sock

    def log(self, name: str) -> str:
        with open(os.path.join(self.dir, name + ".log"), "rb") as f:
            return f.read().decode(errors="replace")

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.shm, ignore_errors=True)


class ClusterCase(unittest.TestCase):
    """Tests of a class share one cluster: an embedded server and the agents
    AGENTS names, whose sockets are sock (the first) and sock2."""

    AGENTS = ("n1",)
    cluster: Cluster
    sock: str
    sock2: str

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster()
        try:
            socks = [cls.cluster.agent(node) for node in cls.AGENTS]
        except BaseException:
            cls.cluster.close()
            raise
        cls.sock = socks[0]
        if len(socks) > 1:
            cls.sock2 = socks[1]

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()


def healthy(sock: str) -> bool:
    from embcache.connection import Connection
    from embcache.errors import AgentUnavailable

    if not os.path.exists(sock):
        return False
    c = Connection(sock)
    try:
        return c.request("GET", "/healthz", timeout=1.0)[0] == 200
    except AgentUnavailable:
        return False
    finally:
        c.close()


def config(tenant="acme", **over):
    from embcache import EncoderPreprocessingConfig

    d = dict(model_id="Qwen/Qwen2.5-Omni-7B", model_revision="r1", encoder_config_hash="b3:vit",
             processor_version="p1", modality="image", tenant=tenant, resize_mode="bicubic",
             image_size=(448, 448), crop_mode="center", normalize_mean=(0.5, 0.5, 0.5),
             normalize_std=(0.5, 0.5, 0.5), input_dtype="bfloat16")
    d.update(over)
    return EncoderPreprocessingConfig(**d)


def python_child(code: str, *args: str) -> subprocess.Popen:
    """Runs code in a new Python process that imports this package."""
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + HERE)
    return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def read_json_line(p: subprocess.Popen, timeout=30.0):
    """The next JSON line the child prints."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise AssertionError(f"child printed nothing in {timeout}s")
    finally:
        sel.close()
    line = p.stdout.readline()
    if not line:
        raise AssertionError(f"child exited ({p.wait()}): {p.stderr.read().decode()}")
    return json.loads(line)


def close_child(p: subprocess.Popen) -> None:
    """Kills the child if it still runs and closes its pipes."""
    if p.poll() is None:
        p.kill()
    p.wait()
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None and not f.closed:
            f.close()
