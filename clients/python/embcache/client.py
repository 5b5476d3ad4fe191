"""EmbeddingCache: the agent's client."""

from __future__ import annotations

import base64
import collections
import http.client
import json
import logging
import mmap
import os
import socket
import threading
import uuid
import weakref
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

from .config import EmbeddingCacheKey, EncoderPreprocessingConfig, StageCacheConfig

log = logging.getLogger("embcache")

try:  # optional: hits become arrays over the mapping
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is absent
    _np = None


class EmbcacheError(Exception):
    """Base of the client's errors."""


class AgentUnavailable(EmbcacheError):
    """The agent's socket cannot be reached (or the agent's store is down,
    in strict mode)."""


class APIError(EmbcacheError):
    """The agent answered a call with an error."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"agent: {status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class AnswerMismatch(EmbcacheError):
    """An answer names another call, key, reservation, client or request
    than the one asked. It is refused, never taken as a value (it would be
    another input's embedding), and the connection it came on is closed: the
    agent then releases that connection's pins and abandons its
    reservations, and the next call opens a new one. It means that
    something else writes to this connection, or that the agent answered
    another question (or is older than these checks: its answers name no
    call)."""


class Tensor(NamedTuple):
    """A computed value without numpy: contiguous little-endian bytes."""

    data: Any  # bytes-like
    dtype: str  # float32, float16, bfloat16, float64, int8, uint8, int16, int32, int64, bool
    shape: Sequence[int]


_NUMPY_DTYPES = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "int8": "i1", "uint8": "u1",
                 "int16": "<i2", "int32": "<i4", "int64": "<i8", "bool": "?", "bfloat16": "<u2"}
_FROM_NUMPY = {"float32": "float32", "float16": "float16", "float64": "float64", "int8": "int8", "uint8": "uint8",
               "int16": "int16", "int32": "int32", "int64": "int64", "bool": "bool"}


class Embedding:
    """A hit: the value's tensor data mapped read-only from the agent's
    shared-memory file, without a copy. It stays valid while this object is
    open (the mapping outlives the file); the request's pin, until
    cleanup_request, keeps the value in the cache."""

    def __init__(self, key: EmbeddingCacheKey, value: dict, path: str, mappings: Optional["_Mappings"] = None):
        self.key = key
        self.path = path  # how the agent got it: local-hit, remote-hit, waited, computed, ...
        self.file = value["file"]
        self.dtype: str = value["dtype"]
        self.shape = tuple(value.get("shape") or ())
        self.kind: str = value["kind"]
        self.tokens = tuple(value.get("tokens") or ())
        self.checksum: str = value["checksum"]
        offset, length = value["offset"], value["length"]
        if offset < 0 or length < 0:
            raise EmbcacheError(f"hit [{offset}, +{length}) of {self.file}")
        self._mmap = (mappings or _Mappings(0)).get(self.file, self.checksum, offset + length)
        whole = memoryview(self._mmap)
        self._views = [whole]
        self.buffer: memoryview = whole[offset:offset + length]  # read-only
        self._views.append(self.buffer)

    def numpy(self):
        """A read-only numpy array over the mapping (no copy). bfloat16,
        which numpy lacks, comes back as uint16."""
        if _np is None:
            raise EmbcacheError("numpy is not installed")
        arr = _np.frombuffer(self.buffer, dtype=_np.dtype(_NUMPY_DTYPES[self.dtype]))
        return arr.reshape(self.shape) if self.shape else arr

    def torch(self):
        """A torch tensor over the mapping (no copy). It must not be
        written to: the pages are read-only and a write faults."""
        import warnings

        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about non-writable buffers
            if self.dtype == "bfloat16":
                t = torch.frombuffer(self.buffer, dtype=torch.int16).view(torch.bfloat16)
            else:
                t = torch.frombuffer(self.buffer, dtype=getattr(torch, self.dtype))
        return t.reshape(self.shape)

    def tobytes(self) -> bytes:
        """A copy of the tensor data."""
        return self.buffer.tobytes()

    def close(self) -> None:
        """Releases this view. The mapping may serve later hits of the same
        value; it is unmapped once the client drops it and no view is left."""
        for v in reversed(self._views):
            v.release()
        self._views = []
        self._mmap = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"Embedding({self.key}, {self.dtype}{list(self.shape)}, {self.path})"


class Reservation:
    """This process must compute the key: commit the value, or abandon."""

    def __init__(self, cache: "EmbeddingCache", key: EmbeddingCacheKey, reservation: str, request_id: str):
        self.cache, self.key, self.id, self.request_id = cache, key, reservation, request_id
        self.done = False

    def __repr__(self) -> str:
        return f"Reservation({self.key}, {self.id})"


class _Connection:
    """One HTTP/1.1 connection to the agent's Unix socket. Written by hand
    rather than with http.client, whose header parsing costs more than the
    rest of a hit: a call here is one send and, for the agent's small
    answers, one recv, parsed with bytes methods.

    HTTP/1.1 has no request ids: the answer to a call is simply the next
    answer on the socket. So a connection makes one call at a time (lock),
    and names each call (the Embcache-Call header, which the agent echoes):
    an answer naming another call means someone else uses the socket, and
    is refused."""

    def __init__(self, path: str, timeout: Optional[float]):
        self.path, self.timeout = path, timeout
        self.sock = None
        self.buf = b""
        self.lock = threading.Lock()  # held for a whole call: send, then read its answer
        self.name = os.urandom(8).hex()  # random: unique among every process's connections
        self.calls = 0

    def _connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            raise
        self.sock, self.buf = s, b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise http.client.IncompleteRead(self.buf)
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > 65536:
                raise http.client.LineTooLong("header line")
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def request(self, method: str, path: str, body: Optional[bytes]) -> tuple:
        """Makes one call; returns (status, body). Raises AnswerMismatch
        (and closes the connection) if the answer is to another call."""
        with self.lock:
            if self.sock is None:
                self._connect()
            self.calls += 1
            call = f"{self.name}.{self.calls}"
            body = body or b""
            head = (f"{method} {path} HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
                    f"Embcache-Call: {call}\r\nContent-Length: {len(body)}\r\n\r\n")
            self.sock.sendall(head.encode("ascii") + body)
            status, echoed, data = self._read_answer()
            if echoed != call.encode("ascii"):
                self.close()  # the stream is not ours alone: nothing more read from it can be trusted
                raise AnswerMismatch(f"agent at {self.path}: {method} {path} was call {call}, the answer is to "
                                     f"call {echoed.decode(errors='replace') or '(none named)'}")
            return status, data

    def _read_answer(self) -> tuple:
        """Reads one answer: (status, the call it names, body)."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > 1 << 20:
                raise http.client.HTTPException("response headers too long")
            self._fill()
        header, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = header.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise http.client.BadStatusLine(repr(lines[0]))
        status = int(parts[1])
        length, chunked, close, echoed = None, False, False, b""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower()
            elif name == b"embcache-call":
                echoed = value.strip()
        if chunked:
            data = self._read_chunked()
        elif length is not None:
            data = self._take(length)
        elif status in (204, 304) or 100 <= status < 200:
            data = b""
        else:  # delimited by the connection's end
            try:
                while True:
                    self._fill()
            except http.client.IncompleteRead:
                pass
            data, self.buf, close = self.buf, b"", True
        if close:
            self.close()
        return status, echoed, data

    def _read_chunked(self) -> bytes:
        out = []
        while True:
            size = int(self._line().split(b";")[0], 16)
            if size == 0:
                while self._line():
                    pass  # trailers
                return b"".join(out)
            out.append(self._take(size))
            self._take(2)

    def close(self) -> None:
        """Closes this process's descriptor of the socket. Not a shutdown():
        in a forked child, whose descriptor is a copy of its parent's, the
        parent's connection stays up (the agent sees a connection end when
        its last descriptor closes). Takes no lock: it may be called while
        another thread waits for an answer, or in a child where the lock
        was held at fork() by a thread the child does not have."""
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""


class _Mappings:
    """The agent's files this process has mapped, by path and checksum. A hit
    of a value already mapped takes a new view of the same pages instead of
    mapping the file again: the checksum names the bytes, so the pages are
    the value's even if the file has since been unlinked. Bounded by mapped
    bytes; a mapping the bound drops is unmapped when its last view goes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._lru = collections.OrderedDict()  # file -> (mmap, checksum)
        self._bytes = 0
        self._lock = threading.Lock()

    def after_fork(self) -> None:
        """In a forked child: the mappings stay valid (a child inherits its
        parent's mappings), but a thread of the parent may have held the
        lock at fork(), and no thread of the child would ever release it."""
        self._lock = threading.Lock()

    def get(self, file: str, checksum: str, need: int):
        with self._lock:
            hit = self._lru.get(file)
            if hit is not None and hit[1] == checksum and len(hit[0]) >= need:
                self._lru.move_to_end(file)
                return hit[0]
        fd = os.open(file, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if need > size:
                raise EmbcacheError(f"hit needs {need} bytes of {file}, which has {size}")
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        with self._lock:
            old = self._lru.pop(file, None)
            if old is not None:
                self._bytes -= len(old[0])
            if self.max_bytes > 0:
                self._lru[file] = (mm, checksum)
                self._bytes += size
            while self._bytes > self.max_bytes and self._lru:
                _, (dropped, _) = self._lru.popitem(last=False)
                self._bytes -= len(dropped)  # unmapped by its last reference
        return mm


Value = Union["Tensor", Any]  # a numpy array, a torch tensor, or a Tensor


class _ProcessState:
    """What a client holds in one process: the identity the agent keeps its
    pins under, one connection per thread, and the lock of that list.

    It belongs to the process that made it (pid). A forked child inherits a
    copy, which it must not use: the sockets are its parent's, so the two
    processes' calls would interleave on them and each would read answers
    to the other's calls; and under the parent's identity, either one's
    cleanup_request (or exit) would drop the other's pins. Nor may the
    child take its locks: one held at fork() by another thread of the
    parent stays held in the child forever."""

    def __init__(self, client_id: str):
        self.pid = os.getpid()
        self.client_id = client_id
        self.local = threading.local()  # .conn: this thread's connection
        self.conns: list = []  # every thread's, for close()
        self.lock = threading.Lock()

    def conn(self, path: str, timeout: Optional[float]) -> _Connection:
        """This thread's connection: a thread's calls never wait behind
        another thread's (a lookup may wait minutes for a compute)."""
        c = getattr(self.local, "conn", None)
        if c is None:
            c = _Connection(path, timeout)
            self.local.conn = c
            with self.lock:
                self.conns.append(c)
        return c

    def drop_conn(self) -> None:
        """Closes this thread's connection; its next call opens another."""
        c = getattr(self.local, "conn", None)
        if c is None:
            return
        self.local.conn = None
        with self.lock:
            if c in self.conns:
                self.conns.remove(c)
        c.close()

    def close(self) -> None:
        """Closes every thread's connection."""
        with self.lock:
            conns, self.conns = self.conns, []
            self.local = threading.local()
        for c in conns:
            c.close()

    def disown(self) -> None:
        """In a forked child, for an inherited state: closes the child's
        copies of the parent's sockets (so that the agent sees the parent's
        connections end when the parent closes them, not when the last
        child exits), taking no lock and touching nothing the parent uses."""
        for c in list(self.conns):
            c.close()


# Every live client, so that a forked child can disown their inherited
# connections before it runs anything else (os.register_at_fork below).
_clients: "weakref.WeakSet[EmbeddingCache]" = weakref.WeakSet()
# Serializes giving clients a state in a new process (_enter_process).
_enter_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _enter_lock
    _enter_lock = threading.Lock()  # a thread of the parent may have held it at fork()
    for client in list(_clients):
        client._enter_process()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


# Answer fields Go leaves out when zero (omitempty).
_OMITTED_WHEN_ZERO = {"model": "", "weight_epoch": 0}


def _key_names(key: EmbeddingCacheKey) -> dict:
    """How an answer names key."""
    return {"key": key.key, "tenant": key.tenant, "model": key.model, "weight_epoch": key.weight_epoch}


def _check_names(call: str, answer: dict, want: dict) -> None:
    """Raises AnswerMismatch unless answer names what want does."""
    for name, value in want.items():
        got = answer.get(name, _OMITTED_WHEN_ZERO.get(name))
        if got != value:
            raise AnswerMismatch(f"{call}: asked for {name} {value!r}, the answer is for {got!r}")


class EmbeddingCache:
    """The node agent's client. Safe to use from threads and across fork():
    each thread of each process has its own connection to the agent, and
    each process its own identity (client_id); a forked child, or a copy
    made by pickling (multiprocessing's spawn and forkserver), opens
    connections of its own on its first call. What a connection holds (pins,
    reservations) is given back by the agent when it closes, so a killed
    process leaks nothing. Every answer is checked to name the call, key and
    request it answers (AnswerMismatch otherwise).

    With enabled=False the client is a pass-through: get_or_compute calls
    compute_fn every time and the agent is never contacted. When the agent
    cannot be reached, store_unavailable_mode="degrade" computes locally
    (logged) and "strict" raises AgentUnavailable.
    """

    def __init__(self, socket_path: Optional[str] = None, *, enabled: bool = True,
                 store_unavailable_mode: str = "degrade", timeout: Optional[float] = 300.0,
                 client_id: Optional[str] = None, mapping_cache_bytes: int = 4 << 30):
        if store_unavailable_mode not in ("degrade", "strict"):
            raise ValueError(f"store_unavailable_mode {store_unavailable_mode!r}: want degrade or strict")
        if enabled and not socket_path:
            raise ValueError("socket_path is required when the cache is enabled")
        self.enabled = enabled
        self.socket_path = socket_path
        self.strict = store_unavailable_mode == "strict"
        self.timeout = timeout
        self.degraded = 0  # computes done without the agent
        self._client_base = client_id  # as given: the identity in the process that made the client
        self._origin_pid = os.getpid()
        self._mapping_cache_bytes = mapping_cache_bytes
        self._setup()

    def _setup(self) -> None:
        """What a client has in the process it is in (not pickled)."""
        self._mappings = _Mappings(self._mapping_cache_bytes)
        self._state = _ProcessState(self._identity())
        _clients.add(self)

    def __getstate__(self) -> dict:
        # Only the settings cross to another process: the copy connects on
        # its own, under an identity of its own (see _identity).
        return {"enabled": self.enabled, "socket_path": self.socket_path, "strict": self.strict,
                "timeout": self.timeout, "degraded": 0, "_client_base": self._client_base,
                "_origin_pid": self._origin_pid, "_mapping_cache_bytes": self._mapping_cache_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    @classmethod
    def from_stage_config(cls, stage: Optional[dict]) -> "EmbeddingCache":
        """A client for a stage config's ``embedding_cache`` block."""
        c = StageCacheConfig.from_stage_config(stage)
        return cls(c.agent_socket, enabled=c.enable_embedding_cache, store_unavailable_mode=c.store_unavailable_mode,
                   timeout=c.request_timeout_s)

    # -- processes and connections -----------------------------------------

    @property
    def client_id(self) -> str:
        """The name the agent keeps this process's pins under."""
        return self._process().client_id

    def _identity(self) -> str:
        """A name for this process's pins. No two processes may share one:
        the agent keeps pins by client and request id, and a request id is
        the same in every stage of a vLLM request. A client_id given to the
        constructor names the process that made the client; any other
        process gets it (or "py") with its pid and a random suffix (pids
        repeat across containers sharing a node's agent)."""
        pid = os.getpid()
        if self._client_base is not None and pid == self._origin_pid:
            return self._client_base
        return f"{self._client_base or 'py'}-{pid}-{uuid.uuid4().hex[:8]}"

    def _process(self) -> _ProcessState:
        """This process's state; a new one if the pid changed. The at-fork
        hook has normally made it already; the pid check also covers a
        fork() that ran no hook (a C extension calling fork directly)."""
        state = self._state
        if state.pid != os.getpid():
            state = self._enter_process()
        return state

    def _enter_process(self) -> _ProcessState:
        """Gives the client a state of its own in this (forked) process, and
        disowns the inherited one."""
        with _enter_lock:
            inherited = self._state
            if inherited.pid == os.getpid():
                return inherited  # another thread got here first
            self._mappings.after_fork()
            self._state = _ProcessState(self._identity())
        inherited.disown()
        return self._state

    def _call(self, method: str, path: str, body: Optional[dict] = None, retry: bool = False,
              answers: Optional[dict] = None) -> Optional[dict]:
        """Makes a call on this thread's connection. answers: the names (key,
        reservation, client, request_id) the answer must carry."""
        if not self.enabled:
            raise EmbcacheError("the embedding cache is disabled")
        payload = json.dumps(body).encode() if body is not None else None
        state = self._process()
        for attempt in (0, 1):
            conn = state.conn(self.socket_path, self.timeout)
            try:
                status, data = conn.request(method, path, payload)
            except AnswerMismatch:
                state.drop_conn()
                raise
            except (OSError, ValueError, http.client.HTTPException) as e:
                state.drop_conn()
                # A reconnect is a new session on the agent: only calls that
                # hold nothing (keys, lookups, stats) are tried again.
                if retry and attempt == 0 and not isinstance(e, (FileNotFoundError, ConnectionRefusedError)):
                    continue
                raise AgentUnavailable(f"agent at {self.socket_path}: {e}") from e
            if status // 100 != 2:
                raise self._error(status, data)
            answer = json.loads(data) if data else None
            if answers:
                try:
                    _check_names(f"{method} {path}", answer or {}, answers)
                except AnswerMismatch:
                    # The connection may hold what the answer was really
                    # for (a reservation nobody will commit): closing it
                    # makes the agent give that back.
                    state.drop_conn()
                    raise
            return answer
        raise AssertionError("unreachable")

    def _error(self, status: int, data: bytes) -> EmbcacheError:
        try:
            err = json.loads(data)
        except ValueError:
            err = {"code": "internal", "error": data.decode(errors="replace")}
        if status == 503 and self.strict:
            return AgentUnavailable(err.get("error", ""))
        return APIError(status, err.get("code", ""), err.get("error", ""))

    def close(self) -> None:
        """Closes every connection of this process: the agent releases
        their pins and abandons their reservations."""
        self._process().close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- keys --------------------------------------------------------------

    def _key(self, body: dict) -> EmbeddingCacheKey:
        r = self._call("POST", "/v1/key", body, retry=True)
        return EmbeddingCacheKey(key=r["key"], tenant=r["tenant"], model=r.get("model", ""),
                                 weight_epoch=r.get("weight_epoch", 0), prefix_keys=tuple(r.get("prefix_keys") or ()))

    def key_from_raw_bytes(self, config: EncoderPreprocessingConfig, data) -> EmbeddingCacheKey:
        """The key of raw input bytes under config."""
        return self._key({"config": config.to_wire(), "mode": "raw-bytes", "data": _b64(data)})

    def key_from_decoded_tensor(self, config: EncoderPreprocessingConfig, tensor, dtype: Optional[str] = None,
                                shape: Optional[Sequence[int]] = None) -> EmbeddingCacheKey:
        """The key of a decoded tensor: a numpy array or torch tensor, or
        bytes with dtype and shape."""
        data, dtype, shape = _tensor_parts(tensor, dtype, shape)
        return self._key({"config": config.to_wire(), "mode": "decoded-tensor", "data": _b64(data),
                          "dtype": dtype, "shape": list(shape)})

    def key_from_tokens(self, config: EncoderPreprocessingConfig, tokens: Sequence[int], block_size: int = 0) -> EmbeddingCacheKey:
        """The key of a token sequence; prefix_keys holds each whole block prefix's."""
        return self._key({"config": config.to_wire(), "mode": "tokens", "tokens": list(tokens), "block_size": block_size})

    # -- the cache ---------------------------------------------------------

    def reserve(self, key: EmbeddingCacheKey, request_id: str) -> Union[Embedding, Reservation]:
        """Looks key up: a hit (an Embedding), or a Reservation when this
        process must compute. Waits while another process computes it."""
        client = self.client_id
        r = self._call("POST", "/v1/lookup", dict(key.to_wire(), client=client, request_id=request_id), retry=True,
                       answers=dict(_key_names(key), client=client, request_id=request_id))
        if r["status"] == "hit":
            return Embedding(key, r["value"], r.get("path", ""), self._mappings)
        return Reservation(self, key, r["reservation"], request_id)

    lookup = reserve

    def commit(self, reservation: Reservation, value: Value, dtype: Optional[str] = None,
               shape: Optional[Sequence[int]] = None) -> Embedding:
        """Hands the computed value to the agent, which shares it with the
        cluster; returns it as a hit. The value is written once into a slot
        file in shared memory (never through the socket)."""
        data, dtype, shape = _tensor_parts(value, dtype, shape)
        client = self.client_id
        mv = memoryview(data).cast("B")
        try:
            # A slot of another reservation would be another key's value.
            slot = self._call("POST", "/v1/slot", {"reservation": reservation.id, "size": mv.nbytes},
                              answers={"reservation": reservation.id})
            with open(slot["file"], "r+b", buffering=0) as f:
                f.write(mv)
            r = self._call("POST", "/v1/commit", {"reservation": reservation.id, "client": client,
                                                  "request_id": reservation.request_id, "dtype": dtype,
                                                  "shape": list(shape), "slot": slot["slot"]},
                           answers=dict(_key_names(reservation.key), reservation=reservation.id, client=client,
                                        request_id=reservation.request_id))
        finally:
            mv.release()
        reservation.done = True
        return Embedding(reservation.key, r["value"], r.get("path", ""), self._mappings)

    def abandon(self, reservation: Reservation, reason: str = "") -> None:
        """Gives the reservation up: another process may compute the key."""
        if reservation.done:
            return
        reservation.done = True
        try:
            self._call("POST", "/v1/abandon", {"reservation": reservation.id, "reason": reason})
        except APIError as e:
            if e.status != 404:  # already ended (its connection closed): nothing to give up
                raise

    def get_or_compute(self, key: Optional[EmbeddingCacheKey], compute_fn: Callable[[], Value], request_id: str):
        """The value of key: from the cache, or computed once in the cluster
        (here, by compute_fn, when this process is the one). Returns an
        Embedding, or compute_fn's result where the cache is off or
        degraded (the agent unreachable in degrade mode)."""
        if not self.enabled or key is None:
            return compute_fn()
        try:
            got = self.reserve(key, request_id)
        except AgentUnavailable as e:
            if self.strict:
                raise
            self.degraded += 1
            log.warning("embcache: agent unavailable, computing locally: %s", e)
            return compute_fn()
        if isinstance(got, Embedding):
            return got
        try:
            value = compute_fn()
        except BaseException as e:
            self.abandon(got, f"compute_fn raised {type(e).__name__}: {e}")
            raise
        try:
            return self.commit(got, value)
        except BaseException:
            try:
                self.abandon(got, "commit failed")
            except EmbcacheError:
                pass
            raise

    def cleanup_request(self, request_id: str) -> int:
        """Ends a request: unpins every value it looked up."""
        if not self.enabled:
            return 0
        client = self.client_id
        r = self._call("POST", "/v1/release", {"client": client, "request_id": request_id},
                       answers={"client": client, "request_id": request_id})
        return r["released"]

    def stats(self) -> dict:
        """The agent's and its cache's counters."""
        return self._call("GET", "/v1/stats", retry=True)


def _b64(data) -> str:
    return base64.b64encode(memoryview(data).cast("B")).decode("ascii")


def _tensor_parts(value, dtype, shape):
    """(bytes-like, dtype name, shape) of a numpy array, torch tensor or Tensor."""
    if isinstance(value, Tensor):
        return value.data, value.dtype, tuple(value.shape)
    mod = type(value).__module__
    if mod.startswith("torch"):
        import torch

        t = value.detach().contiguous().cpu()
        name = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().data, "bfloat16", tuple(t.shape)
        return t.numpy().data, name, tuple(t.shape)
    if _np is not None and isinstance(value, _np.ndarray):
        a = _np.ascontiguousarray(value)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        name = dtype or _FROM_NUMPY.get(a.dtype.name)
        if name is None:
            raise EmbcacheError(f"numpy dtype {a.dtype} has no embcache name; pass dtype=")
        return a.data, name, tuple(shape) if shape is not None else a.shape
    if dtype is None or shape is None:
        raise EmbcacheError("bytes need dtype= and shape= (or pass a numpy array, a torch tensor or a Tensor)")
    return value, dtype, tuple(shape)
