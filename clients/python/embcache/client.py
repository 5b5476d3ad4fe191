"""EmbeddingCache: the agent's client."""

from __future__ import annotations

import functools
import json
import logging
import numbers
import os
import threading
import urllib.parse
import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union

from . import _process, _slots
from ._degrade import Policy
from ._process import ProcessState
from .connection import Connection, Pool, ProtocolError
from .embedding import Embedding, Mappings
from .errors import (AgentTimeout, AgentUnavailable, AnswerMismatch, APIError, BadRequest, EmbcacheError, InvalidValue,
                     ReservationEnded, StoreFull, api_error)
from .key import EmbeddingCacheKey, EncoderPreprocessingConfig, KeySource
from .stage import StageCacheConfig
from .values import parts_of, tensor_parts, token_list

log = logging.getLogger("embcache")

T = TypeVar("T")

# Timeouts past this are refused (a day): a larger one overflows the
# socket's, and means "never" better said by a day.
_MAX_TIMEOUT = 86400.0
# Asks the agent to send heartbeats while a lookup waits for a compute.
_HEARTBEATS = {"Embcache-Heartbeat": "1"}
# Answer fields Go leaves out when zero (omitempty).
_OMITTED_WHEN_ZERO: Dict[str, Any] = {"model": "", "weight_epoch": 0}


class Reservation:
    """This process must compute the key: commit the value, or abandon it.
    It holds the connection it was granted on (the agent ends a reservation
    when that connection closes, which is how a killed process gives the key
    back at once) until it is committed or abandoned. In a ``with`` block
    it is abandoned on the way out unless it was committed::

        got = cache.reserve(key, request_id)
        if isinstance(got, Reservation):
            with got:
                got.commit(encoder(pixels))

    Another process may commit what a lookup here reserved (embcache.vllm
    does): Reservation(cache, key, id, request_id, None, slot_file) names
    it, and its calls go on a connection of cache's pool."""

    def __init__(self, cache: "EmbeddingCache", key: EmbeddingCacheKey, reservation: str, request_id: str,
                 conn: Optional[Connection] = None, slot_file: str = ""):
        self.cache, self.key, self.id, self.request_id = cache, key, reservation, request_id
        self.conn = conn
        self.slot_file = slot_file  # where the value may be written without asking for a slot
        self.done = False
        self._failure = ""  # why the last commit failed: the reason the reservation is abandoned with
        # Its verbs run one at a time: an abandon from another thread (a
        # cancelled asyncio task's, a publisher's) waits for a commit in
        # flight on the same connection, then finds the reservation ended.
        self._lock = threading.Lock()

    def commit(self, value: Any, dtype: Optional[str] = None, shape: Optional[Sequence[int]] = None) -> None:
        """Hands the computed value to the agent, which shares it with the
        cluster. Tensor data is written once into a slot file in shared
        memory (never through the socket); the agent answers as soon as it
        has the slot, and checksums, stores and commits the value after
        that, so this returns within a call of the copy. Raises (both
        modes; ReservationEnded if it was committed or abandoned already);
        get_or_compute is the call that degrades."""
        self.cache._commit(self, value, dtype, shape)

    def abandon(self, reason: str = "") -> None:
        """Gives the key back: another process may compute it (reason is
        what its waiters are told). This object has ended when this
        returns or raises: if the agent did not take the abandon, the
        connection holding the reservation is closed, which makes the agent
        end it (one named by hand, without a connection, ends with its own
        process's connection or at the compute timeout). Abandoning an
        ended reservation does nothing."""
        self.cache._abandon(self, reason)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        """Abandons the reservation unless it was committed, giving the
        commit's failure (or the exception that left the block) as the
        reason. A failed abandon is logged, not raised: it would hide the
        block's own exception, and the reservation has ended anyway."""
        if self.done:
            return
        if self._failure or exc is None:
            reason = self._failure or "not committed"
        else:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        try:
            self.abandon(reason)
        except EmbcacheError as e:
            log.debug("embcache: abandon of %s failed: %s", self, e)

    def __repr__(self) -> str:
        return f"Reservation({self.key}, {self.id})"


def _key_names(key: EmbeddingCacheKey) -> Dict[str, Any]:
    """How an answer names key."""
    return {"key": key.key, "tenant": key.tenant, "model": key.model, "weight_epoch": key.weight_epoch}


def _check_names(call: str, answer: Mapping[str, Any], want: Mapping[str, Any]) -> None:
    """Raises AnswerMismatch unless answer names what want does."""
    for name, value in want.items():
        got = answer.get(name, _OMITTED_WHEN_ZERO.get(name))
        if got != value:
            raise AnswerMismatch(f"{call}: asked for {name} {value!r}, the answer is for {got!r}")


@functools.lru_cache(maxsize=256)
def _config_header(config: EncoderPreprocessingConfig) -> str:
    """The config as the Embcache-Config header carries it (ASCII JSON)."""
    return json.dumps(config.to_wire(), separators=(",", ":"))


class EmbeddingCache:
    """The node agent's client. Safe to use from threads and across fork():
    calls take a connection from the process's pool (at most
    max_idle_connections stay open between calls), and each process has
    its own identity (client_id); a forked child, or a copy made by
    pickling (multiprocessing's spawn and forkserver), opens connections of
    its own on its first call. What a process holds (pins, reservations) is
    given back by the agent when its connections close, so a killed process
    leaks nothing. Every answer is checked to name the call, key and request
    it answers (AnswerMismatch otherwise).

    Two timeouts: agent_timeout bounds every exchange with the agent (it
    answers in milliseconds; a hung agent costs a caller this long), and
    compute_timeout bounds a lookup's wait for another process's compute
    (plus agent_timeout).

    socket_path is the agent's socket; by default $EMBCACHE_AGENT_SOCKET,
    which `embcache agent` reads too. Each connection checks who listens
    on it first: a process of any user but this process's, root, or
    agent_uid (default $EMBCACHE_AGENT_UID: the user an agent with
    --shm-group runs as) gets nothing (UntrustedAgent).

    With enabled=False the client is a pass-through: get_or_compute calls
    compute_fn every time and the agent is never contacted. When the cache
    fails (the agent unreachable, hung or killed, its store full, its NATS
    down, a compute past its timeout), store_unavailable_mode="degrade"
    serves every call without it: get_or_compute returns compute_fn's
    value, get and key calls return None, cleanup_request 0; failures are
    counted (``degraded``) and logged once per episode. "strict" raises the
    typed error (errors.py) instead. ``policy`` is that choice in this
    process: a wrapper that composes this client's calls (AsyncEmbeddingCache)
    reports its failures to ``policy.failed``.
    """

    def __init__(self, socket_path: Optional[str] = None, *, enabled: bool = True,
                 store_unavailable_mode: str = "degrade", agent_timeout: float = 5.0,
                 compute_timeout: float = 300.0, client_id: Optional[str] = None,
                 mapping_cache_bytes: int = 4 << 30, max_idle_connections: int = 4,
                 key_slot_max_bytes: int = 64 << 20, agent_uid: Optional[int] = None):
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled={enabled!r}: want True or False")
        if store_unavailable_mode not in ("degrade", "strict"):
            raise ValueError(f"store_unavailable_mode {store_unavailable_mode!r}: want degrade or strict")
        if socket_path is None:
            socket_path = os.environ.get("EMBCACHE_AGENT_SOCKET")  # as the agent reads it
        if enabled and not socket_path:
            raise ValueError("socket_path is required when the cache is enabled (or $EMBCACHE_AGENT_SOCKET)")
        for name, t in (("agent_timeout", agent_timeout), ("compute_timeout", compute_timeout)):
            if not 0 < t <= _MAX_TIMEOUT:  # also refuses NaN
                raise ValueError(f"{name}={t!r}: want seconds in (0, {_MAX_TIMEOUT:g}]")
        if agent_uid is None and os.environ.get("EMBCACHE_AGENT_UID"):
            try:
                agent_uid = int(os.environ["EMBCACHE_AGENT_UID"])
            except ValueError:
                raise ValueError(f"$EMBCACHE_AGENT_UID={os.environ['EMBCACHE_AGENT_UID']!r}: want a numeric user ID") from None
        if agent_uid is not None and (isinstance(agent_uid, bool) or not isinstance(agent_uid, int)
                                      or not 0 <= agent_uid < 1 << 32):
            raise ValueError(f"agent_uid={agent_uid!r}: want a numeric user ID")
        self.enabled = enabled
        self.socket_path = socket_path or ""
        self._trusted_uids = frozenset() if agent_uid is None else frozenset([agent_uid])
        self.strict = store_unavailable_mode == "strict"
        self.agent_timeout = float(agent_timeout)
        self.compute_timeout = float(compute_timeout)
        self._client_base = client_id  # as given: the identity in the process that made the client
        self._origin_pid = os.getpid()
        self._mapping_cache_bytes = mapping_cache_bytes
        self._max_idle = max_idle_connections
        self.key_slot_max_bytes = key_slot_max_bytes
        self._setup()

    def _setup(self) -> None:
        """What a client has in the process it is in (not pickled)."""
        self._mappings = Mappings(self._mapping_cache_bytes)
        self._state = ProcessState(self._identity(), self.socket_path, self._max_idle, self._trusted_uids)
        self.policy = Policy(self.strict)  # store_unavailable_mode, in this process
        _process.at_fork(self, EmbeddingCache._enter_process)

    _SETTINGS = ("enabled", "socket_path", "strict", "agent_timeout", "compute_timeout", "_client_base",
                 "_origin_pid", "_mapping_cache_bytes", "_max_idle", "key_slot_max_bytes", "_trusted_uids")

    def __getstate__(self) -> Dict[str, Any]:
        # Only the settings cross to another process: the copy connects on
        # its own, under an identity of its own (see _identity).
        return {name: getattr(self, name) for name in self._SETTINGS}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state.setdefault("_trusted_uids", frozenset())  # pickled by a client that had no agent_uid
        self.__dict__.update(state)
        self._setup()

    @classmethod
    def from_stage_config(cls, stage: Optional[Mapping[str, Any]]) -> "EmbeddingCache":
        """A client for a stage config's ``embedding_cache`` block."""
        c = StageCacheConfig.from_stage_config(stage)
        return cls(c.agent_socket, enabled=c.enable_embedding_cache, store_unavailable_mode=c.store_unavailable_mode,
                   agent_timeout=c.agent_timeout_s, compute_timeout=c.request_timeout_s)

    @property
    def degraded(self) -> int:
        """Calls served without the cache because it failed (degrade mode)."""
        return self.policy.total

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

    def _process(self) -> ProcessState:
        """This process's state; a new one if the pid changed. The at-fork
        hook has normally made it already; the pid check also covers a
        fork() that ran no hook (a C extension calling fork directly)."""
        state = self._state
        if state.pid != os.getpid():
            state = self._enter_process()
        return state

    def _enter_process(self) -> ProcessState:
        """Gives the client a state of its own in this (forked) process, and
        disowns the inherited one."""
        with _process.entering():
            inherited = self._state
            if inherited.pid == os.getpid():
                return inherited  # another thread got here first
            self._mappings.after_fork()
            self.policy = Policy(self.strict)
            self._state = ProcessState(self._identity(), self.socket_path, self._max_idle, self._trusted_uids)
        inherited.pool.disown()
        return self._state

    def open_connections(self) -> int:
        """How many connections to the agent this process holds open."""
        return self._process().pool.open_count()

    def _call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, *, retry: bool = False,
              answers: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None,
              conn: Optional[Connection] = None, raw: Optional[Tuple[Any, Mapping[str, str]]] = None,
              state: Optional[ProcessState] = None, total: Optional[float] = None,
              headers: Optional[Mapping[str, str]] = None) -> Any:
        """Makes a call on a pooled connection (or on conn, which the caller
        holds). answers: the names (key, reservation, client, request_id)
        the answer must carry. raw: (bytes-like body, headers) sent as
        application/octet-stream instead of a JSON body. retry: the call
        holds nothing, so it is made again once on a new connection if a
        pooled one turns out dead (the agent restarted)."""
        if not self.enabled:
            raise EmbcacheError("the embedding cache is disabled")
        if raw is not None:
            payload, headers, ctype = raw[0], raw[1], "application/octet-stream"
        else:
            payload = json.dumps(body).encode() if body is not None else b""
            ctype = "application/json"
        pool = (state or self._process()).pool
        for attempt in (0, 1):
            c = conn or pool.take()
            reused = c.calls > 0
            try:
                status, data = c.request(method, path, payload, timeout=timeout or self.agent_timeout,
                                         content_type=ctype, headers=headers, total=total)
            except AgentUnavailable as e:
                if conn is None:
                    pool.give(c)  # closed by the failure: dropped
                if retry and attempt == 0 and reused and not isinstance(e, AgentTimeout):
                    continue  # a pooled connection the agent had closed (it restarted)
                raise
            except BaseException:
                c.close()  # interrupted mid-call: the stream's state is unknown
                if conn is None:
                    pool.give(c)
                raise
            try:
                answer = self._answer(method, path, status, data, answers)
            except AnswerMismatch:
                # The connection may hold what the answer was really for (a
                # reservation nobody will commit): closing it makes the
                # agent give that back. Closed before it goes back to the
                # pool, where another thread could take it.
                c.close()
                raise
            finally:
                if conn is None:
                    pool.give(c)
            self.policy.ok()
            return answer
        raise AssertionError("unreachable")

    def _answer(self, method: str, path: str, status: int, data: bytes, answers: Optional[Mapping[str, Any]]) -> Any:
        """The answer's JSON body, checked; its error as a typed one."""
        if status // 100 != 2:
            raise self._error(status, data)
        try:
            answer = json.loads(data) if data else None
        except ValueError as e:
            raise ProtocolError(f"agent at {self.socket_path}: {method} {path}: an answer that is not JSON: {e}") from e
        if answers:
            _check_names(f"{method} {path}", answer if isinstance(answer, dict) else {}, answers)
        return answer

    def _embedding(self, key: EmbeddingCacheKey, answer: Mapping[str, Any]) -> Embedding:
        """The hit an answer describes, mapped."""
        try:
            return Embedding(key, answer["value"], str(answer.get("path", "")), self._mappings)
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"agent at {self.socket_path}: a hit that does not describe a value: {e!r}") from e

    @staticmethod
    def _error(status: int, data: bytes) -> APIError:
        try:
            err = json.loads(data)
        except ValueError:
            err = {"code": "internal", "error": data.decode(errors="replace")}
        return api_error(status, str(err.get("code", "")), str(err.get("error", "")))

    def close(self) -> None:
        """Closes this process's idle connections, and each busy one when
        its call ends: the agent releases the pins of a client whose last
        connection closed, and abandons a closed connection's reservations.
        The client may be used again (it reconnects)."""
        self._process().pool.close()

    def __enter__(self) -> "EmbeddingCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- keys --------------------------------------------------------------

    def _key(self, ask: Callable[[], Any]) -> Optional[EmbeddingCacheKey]:
        """The key ask() answers; None (degraded) if the cache fails."""
        if not self.enabled:
            return None
        try:
            r = ask()
        except BadRequest:
            raise  # the config or input is wrong: a bug to fix, not a failure to ride out
        except EmbcacheError as e:
            self.policy.failed("key", e)
            return None
        return EmbeddingCacheKey(key=r["key"], tenant=r["tenant"], model=r.get("model", ""),
                                 weight_epoch=r.get("weight_epoch", 0), prefix_keys=tuple(r.get("prefix_keys") or ()))

    def _key_of_bytes(self, query: str, data: Any, config: EncoderPreprocessingConfig) -> Optional[EmbeddingCacheKey]:
        """The key of data (bytes-like) under config: copied into the
        connection's key slot (shared memory) and hashed by the agent where
        it lies, or, small or very large, sent as the call's body."""
        headers = {"Embcache-Config": _config_header(config)}
        mv = _slots.flat(data)

        def ask() -> Any:
            if _slots.KEY_SLOT_MIN <= mv.nbytes <= self.key_slot_max_bytes:
                try:
                    return self._key_in_slot(query, mv, headers)
                except (StoreFull, _slots.SlotUnusable) as e:  # no room for a slot: the body needs none
                    log.debug("embcache: key slot: %s; sending the input", e)
            return self._call("POST", "/v1/key/bytes?" + query, raw=(mv, headers), retry=True)

        try:
            return self._key(ask)
        finally:
            mv.release()

    def _key_in_slot(self, query: str, mv: memoryview, headers: Mapping[str, str]) -> Any:
        n = mv.nbytes

        def use(conn: Connection) -> Any:
            try:
                slot = conn.key_slot
                if slot is None or len(slot[1]) < n:
                    size = _slots.key_slot_size(n)
                    r = self._call("POST", "/v1/key/slot", {"size": size}, conn=conn)
                    mm = _slots.map_key_slot(r["file"], size)
                    if slot is not None:
                        slot[1].close()
                    slot = conn.key_slot = (r["slot"], mm)
                slot[1][:n] = mv
            except OSError as e:  # the slot's file: mapping it
                conn.close()
                raise _slots.SlotUnusable(f"agent at {self.socket_path}: key slot: {e}") from e
            return self._call("POST", f"/v1/key/bytes?{query}&slot={slot[0]}&length={n}", raw=(b"", headers),
                              conn=conn)

        return self._on_pooled(self._process().pool, use)

    def _on_pooled(self, pool: Pool, use: Callable[[Connection], T]) -> T:
        """use(conn) on a connection of the pool, made again once on a new
        one if a reused connection turns out dead (the agent restarted):
        for calls that hold nothing when they fail. The connection goes
        back to the pool after, unless the result holds it (a
        Reservation)."""
        for attempt in (0, 1):
            conn = pool.take()
            reused, held = conn.calls > 0, False
            try:
                got = use(conn)
                held = isinstance(got, Reservation) and got.conn is conn
                return got
            except AgentUnavailable as e:
                if attempt == 0 and reused and not isinstance(e, (AgentTimeout, APIError)):
                    continue
                raise
            finally:
                if not held:
                    pool.give(conn)
        raise AssertionError("unreachable")

    def key_from_raw_bytes(self, config: EncoderPreprocessingConfig, data: Any) -> Optional[EmbeddingCacheKey]:
        """The key of raw input bytes (a JPEG, a WAV) under config. The agent
        hashes them (BLAKE3): copied once into a shared-memory slot of the
        connection, or sent as they are (no encoding). None when the cache
        is off, or degraded (get_or_compute(None, ...) computes)."""
        return self._key_of_bytes("mode=raw-bytes", data, config)

    def key_from_decoded_tensor(self, config: EncoderPreprocessingConfig, tensor: Any, dtype: Optional[str] = None,
                                shape: Optional[Sequence[int]] = None) -> Optional[EmbeddingCacheKey]:
        """The key of a decoded tensor (its dtype and shape are part of the
        key): a numpy array or torch tensor, or bytes with dtype and shape."""
        data, dt, sh = tensor_parts(tensor, dtype, shape)
        q = urllib.parse.urlencode({"mode": "decoded-tensor", "dtype": dt, "shape": ",".join(str(int(d)) for d in sh)})
        return self._key_of_bytes(q, data, config)

    def key_from_tokens(self, config: EncoderPreprocessingConfig, tokens: Sequence[int],
                        block_size: int = 0) -> Optional[EmbeddingCacheKey]:
        """The key of a token sequence; prefix_keys holds each whole block prefix's."""
        if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or block_size < 0:
            raise InvalidValue(f"block_size is a non-negative integer (0: the default), not {block_size!r}")
        body = {"config": config.to_wire(), "mode": "tokens", "tokens": token_list(tokens), "block_size": int(block_size)}
        return self._key(lambda: self._call("POST", "/v1/key", body, retry=True))

    # -- the cache ---------------------------------------------------------

    def reserve(self, key: EmbeddingCacheKey, request_id: str) -> Union[Embedding, Reservation]:
        """Looks key up: a hit (an Embedding, pinned for request_id), or a
        Reservation when this process must compute (commit it or abandon
        it; ``with reservation:`` abandons it unless committed). Waits
        while another process computes it, up to compute_timeout. Raises
        (both modes)."""
        if not self.enabled or key is None:
            raise EmbcacheError("reserve needs a key and an enabled cache (get_or_compute takes None)")
        state = self._process()
        client = state.client_id

        def use(conn: Connection) -> Union[Embedding, Reservation]:
            # Heartbeats (1 s apart) while the lookup waits for another
            # process's compute: each silence is bounded by agent_timeout,
            # the whole wait by compute_timeout. A reservation holds conn.
            r = self._call("POST", "/v1/lookup", dict(key.to_wire(), client=client, request_id=request_id),
                           answers=dict(_key_names(key), client=client, request_id=request_id),
                           timeout=max(self.agent_timeout, 2.0), total=self.compute_timeout + self.agent_timeout,
                           headers=_HEARTBEATS, conn=conn, state=state)
            if r["status"] == "hit":
                return self._embedding(key, r)
            return Reservation(self, key, r["reservation"], request_id, conn, r.get("slot_file", ""))

        return self._on_pooled(state.pool, use)

    # A second name (the agent's call is POST /v1/lookup), kept for the
    # code that calls it; reserve is the name, as in the RFC's
    # reserve/commit/abandon.
    lookup = reserve

    def _end(self, reservation: Reservation) -> None:
        reservation.done = True
        conn, reservation.conn = reservation.conn, None
        if conn is not None:
            self._process().pool.give(conn)

    def commit(self, reservation: Reservation, value: Any, dtype: Optional[str] = None,
               shape: Optional[Sequence[int]] = None) -> None:
        """reservation.commit(value, dtype, shape), made by this client."""
        self._commit(reservation, value, dtype, shape)

    def _commit(self, reservation: Reservation, value: Any, dtype: Optional[str],
                shape: Optional[Sequence[int]]) -> None:
        with reservation._lock:  # one verb at a time (see Reservation)
            self._commit_locked(reservation, value, dtype, shape)

    def _commit_locked(self, reservation: Reservation, value: Any, dtype: Optional[str],
                       shape: Optional[Sequence[int]]) -> None:
        if reservation.done:
            raise ReservationEnded(410, "reservation_ended", f"{reservation} was already committed or abandoned")
        client = self.client_id
        mv: Optional[memoryview] = None
        own = ""  # a slot file this process made, which no agent may remove
        try:
            p = parts_of(value, dtype, shape)
            body: Dict[str, Any] = {"reservation": reservation.id, "client": client,
                                    "request_id": reservation.request_id, "kind": p.kind}
            if p.kind != "tokens":
                body.update(dtype=p.dtype, shape=list(p.shape))
            if p.tokens:
                body["tokens"] = p.tokens
            mv = _slots.flat(p.data)
            if p.kind != "tokens":
                body["slot"], own = self._write_slot(reservation, mv)
            self._call("POST", "/v1/commit", body, conn=reservation.conn,
                       answers=dict(_key_names(reservation.key), reservation=reservation.id, client=client,
                                    request_id=reservation.request_id))
        except BaseException as e:
            reservation._failure = f"commit failed: {type(e).__name__}: {e}"
            # An agent that restarted since the lookup emptied the slot
            # directory before this file was made, and knows nothing of it.
            if own:
                try:
                    os.unlink(own)
                except OSError:
                    pass
            raise
        finally:
            if mv is not None:
                mv.release()
        self._end(reservation)

    def _write_slot(self, reservation: Reservation, mv: memoryview) -> Tuple[str, str]:
        """Writes the value's bytes into a slot file; returns the slot's
        name for the commit, and the file's path if this process made it
        (a failed commit removes it). The file the lookup's answer named is
        made here (no call); an agent that named none, or a slot directory
        this process may not write to, gets one by POST /v1/slot. A failed
        write removes the file: nothing is left in shared memory."""
        if reservation.slot_file and _slots.create_value(reservation.slot_file, mv):
            return reservation.id, reservation.slot_file
        # A slot of another reservation would be another key's value.
        slot = self._call("POST", "/v1/slot", {"reservation": reservation.id, "size": mv.nbytes},
                          answers={"reservation": reservation.id}, conn=reservation.conn)
        if mv.nbytes:
            _slots.fill_value(slot["file"], mv)
        return str(slot["slot"]), ""

    def abandon(self, reservation: Reservation, reason: str = "") -> None:
        """reservation.abandon(reason), made by this client."""
        self._abandon(reservation, reason)

    def _abandon(self, reservation: Reservation, reason: str) -> None:
        with reservation._lock:  # one verb at a time (see Reservation)
            self._abandon_locked(reservation, reason)

    def _abandon_locked(self, reservation: Reservation, reason: str) -> None:
        if reservation.done:
            return
        conn = reservation.conn
        try:
            if conn is not None and conn.closed:
                return  # its connection closed: the agent has ended it already
            self._call("POST", "/v1/abandon", {"reservation": reservation.id, "reason": reason}, conn=conn)
        except BaseException as e:
            if isinstance(e, ReservationEnded) or (isinstance(e, APIError) and e.status in (404, 410)):
                return  # ended already
            if conn is not None:
                conn.close()  # not back into the pool still holding the reservation
            raise
        finally:
            self._end(reservation)

    def get(self, key: Optional[EmbeddingCacheKey], request_id: str) -> Optional[Embedding]:
        """The cached value of key (pinned for request_id), or None: not
        cached, still computing elsewhere, the cache off or degraded. Never
        reserves the key nor waits for a compute: a miss here holds nobody
        up (a commit the agent has answered and is storing is waited for:
        a get right after get_or_compute or put hits)."""
        if not self.enabled or key is None:
            return None
        client = self.client_id
        try:
            r = self._call("POST", "/v1/get", dict(key.to_wire(), client=client, request_id=request_id),
                           answers=dict(_key_names(key), client=client, request_id=request_id), retry=True)
            if r["status"] != "hit":
                return None
            return self._embedding(key, r)
        except EmbcacheError as e:
            self.policy.failed("get", e)
            return None

    def put(self, key: Optional[EmbeddingCacheKey], value: Any) -> bool:
        """Stores value as key's, unless the cluster has it already (or
        computes it: then that value stands). True if this call handed it
        to the agent, which stores and shares it after answering (a get
        through the same agent right after waits for that); False if the
        cluster had it, or degraded."""
        if not self.enabled or key is None:
            return False
        request_id = f"put-{uuid.uuid4().hex}"
        try:
            got = self.reserve(key, request_id)
        except EmbcacheError as e:
            self.policy.failed("put", e, value)
            return False
        if isinstance(got, Embedding):
            got.close()
            self.cleanup_request(request_id)
            return False
        with got:  # abandoned on the way out unless committed
            try:
                got.commit(value)
            except EmbcacheError as e:
                self.policy.failed("put", e, value)
                return False
        return True

    def get_or_compute(self, key: Optional[EmbeddingCacheKey], compute_fn: Callable[[], T],
                       request_id: str) -> Union[Embedding, T]:
        """The value of key: from the cache (an Embedding, pinned for
        request_id), or computed once in the cluster, here by compute_fn
        when this process is the one (its result is returned as it is, and
        shared). Where the cache is off, key is None, or the cache fails in
        degrade mode, compute_fn's result. compute_fn's own exceptions
        propagate (the key is given back for another process to compute)."""
        if not self.enabled or key is None:
            return compute_fn()
        try:
            got = self.reserve(key, request_id)
        except EmbcacheError as e:
            self.policy.failed("lookup", e)
            return compute_fn()
        if isinstance(got, Embedding):
            return got
        with got:  # abandoned on the way out unless committed
            value = compute_fn()
            try:
                got.commit(value)
            except EmbcacheError as e:
                self.policy.failed("commit", e, value)
        return value

    def cleanup_request(self, request_id: str) -> int:
        """Ends a request: unpins every value it looked up. Returns how
        many pins were dropped (0 when the cache is off or degraded)."""
        if not self.enabled:
            return 0
        client = self.client_id
        try:
            r = self._call("POST", "/v1/release", {"client": client, "request_id": request_id},
                           answers={"client": client, "request_id": request_id}, retry=True)
        except EmbcacheError as e:
            self.policy.failed("cleanup_request", e)
            return 0
        return int(r["released"])

    def stats(self) -> Dict[str, Any]:
        """The agent's and its cache's counters, and this client's
        ("client": degraded calls, open connections). Without the agent
        (degrade mode), only the client's."""
        out: Dict[str, Any] = {}
        if self.enabled:
            try:
                out = dict(self._call("GET", "/v1/stats", retry=True))
            except EmbcacheError as e:
                self.policy.failed("stats", e)
        out["client"] = {"degraded": self.degraded, "open_connections": self.open_connections(),
                         "client_id": self.client_id}
        return out


if TYPE_CHECKING:  # pragma: no cover - mypy checks that the client makes keys for EmbeddingCacheKey's constructors
    _: Type[KeySource] = EmbeddingCache
