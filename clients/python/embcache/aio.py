"""AsyncEmbeddingCache: the client for asyncio code."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import os
import threading
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Optional, Sequence, TypeVar, Union, cast

from .client import EmbeddingCache, Reservation
from .embedding import Embedding
from .errors import EmbcacheError
from .key import EmbeddingCacheKey, EncoderPreprocessingConfig

log = logging.getLogger("embcache")

T = TypeVar("T")


class AsyncEmbeddingCache:
    """EmbeddingCache for asyncio: every call that talks to the agent runs
    on a thread of the client's own pool (at most max_concurrency calls at
    once), so the event loop never blocks, not even for a lookup that waits
    minutes for another process's compute. compute_fn may be a coroutine
    function (awaited on the loop) or a plain one (called on the loop, as a
    caller's own code would be). Modes, timeouts, errors and fork safety are
    EmbeddingCache's (its arguments are taken as they are); ``sync`` is the
    underlying client.

    A task cancelled during a call does not leak what the call got: a
    reservation it was granted is abandoned, a hit closed."""

    def __init__(self, socket_path: Optional[str] = None, *, max_concurrency: int = 64, **kwargs: Any):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency {max_concurrency}: want >= 1")
        self.sync = EmbeddingCache(socket_path, **kwargs)
        self._max = max_concurrency
        self._lock = threading.Lock()
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pid = os.getpid()

    @property
    def enabled(self) -> bool:
        return self.sync.enabled

    @property
    def degraded(self) -> int:
        return self.sync.degraded

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        # Threads do not survive fork(): a child makes its own pool, and a
        # lock of its own (one a parent's thread held at fork() stays held).
        if self._pid != os.getpid():
            self._lock = threading.Lock()
            self._executor, self._pid = None, os.getpid()
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(self._max, thread_name_prefix="embcache")
            return self._executor

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        call = self._pool().submit(fn, *args)
        try:
            return await asyncio.shield(asyncio.wrap_future(call))
        except asyncio.CancelledError:
            # On the call's thread, not the loop's: the loop may be gone or
            # busy by the time the call ends (and if it has ended, on a
            # thread of the pool, not here on the loop).
            if call.done():
                self._pool().submit(self._drop_result, call)
            else:
                call.add_done_callback(self._drop_result)
            raise

    def _drop_result(self, call: "concurrent.futures.Future[Any]") -> None:
        """What a cancelled call got, given back."""
        if call.cancelled() or call.exception() is not None:
            return
        got = call.result()
        if isinstance(got, Reservation):
            try:
                got.abandon("the caller was cancelled")
            except EmbcacheError as e:  # it has ended all the same (Reservation.abandon)
                log.debug("embcache: abandon of %s failed: %s", got, e)
        elif isinstance(got, Embedding):
            got.close()

    @contextlib.asynccontextmanager
    async def _holding(self, r: Reservation) -> AsyncIterator[Reservation]:
        """``with r:`` for a coroutine: r is abandoned on the way out unless
        committed, on a thread of the pool (a call to the agent, which the
        loop must not wait for, nor can a cancelled task)."""
        try:
            yield r
        except BaseException as e:
            if not r.done:
                self._pool().submit(r.__exit__, type(e), e, e.__traceback__)
            raise
        if not r.done:
            self._pool().submit(r.__exit__, None, None, None)

    @staticmethod
    async def _compute(compute_fn: Callable[[], Union[T, Awaitable[T]]]) -> T:
        got = compute_fn()
        if inspect.isawaitable(got):
            return cast(T, await got)
        return cast(T, got)

    async def key_from_raw_bytes(self, config: EncoderPreprocessingConfig, data: Any) -> Optional[EmbeddingCacheKey]:
        return await self._run(self.sync.key_from_raw_bytes, config, data)

    async def key_from_decoded_tensor(self, config: EncoderPreprocessingConfig, tensor: Any,
                                      dtype: Optional[str] = None,
                                      shape: Optional[Sequence[int]] = None) -> Optional[EmbeddingCacheKey]:
        return await self._run(self.sync.key_from_decoded_tensor, config, tensor, dtype, shape)

    async def key_from_tokens(self, config: EncoderPreprocessingConfig, tokens: Sequence[int],
                              block_size: int = 0) -> Optional[EmbeddingCacheKey]:
        return await self._run(self.sync.key_from_tokens, config, tokens, block_size)

    async def reserve(self, key: EmbeddingCacheKey, request_id: str) -> Union[Embedding, Reservation]:
        return await self._run(self.sync.reserve, key, request_id)

    async def commit(self, reservation: Reservation, value: Any) -> None:
        await self._run(self.sync.commit, reservation, value)

    async def abandon(self, reservation: Reservation, reason: str = "") -> None:
        await self._run(self.sync.abandon, reservation, reason)

    async def get(self, key: Optional[EmbeddingCacheKey], request_id: str) -> Optional[Embedding]:
        return await self._run(self.sync.get, key, request_id)

    async def put(self, key: Optional[EmbeddingCacheKey], value: Any) -> bool:
        return await self._run(self.sync.put, key, value)

    async def get_or_compute(self, key: Optional[EmbeddingCacheKey],
                             compute_fn: Callable[[], Union[T, Awaitable[T]]],
                             request_id: str) -> Union[Embedding, T]:
        """EmbeddingCache.get_or_compute, awaiting the agent off the loop."""
        sync = self.sync
        if not sync.enabled or key is None:
            return await self._compute(compute_fn)
        try:
            got = await self.reserve(key, request_id)
        except EmbcacheError as e:
            sync.policy.failed("lookup", e)
            return await self._compute(compute_fn)
        if isinstance(got, Embedding):
            return got
        async with self._holding(got):  # abandoned on the way out unless committed
            value = await self._compute(compute_fn)
            try:
                await self.commit(got, value)
            except EmbcacheError as e:
                sync.policy.failed("commit", e, value)
        return value

    async def cleanup_request(self, request_id: str) -> int:
        return await self._run(self.sync.cleanup_request, request_id)

    async def stats(self) -> Dict[str, Any]:
        return await self._run(self.sync.stats)

    async def close(self) -> None:
        """Closes the connections and the client's threads."""
        await self._run(self.sync.close)
        with self._lock:
            ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=False)

    async def __aenter__(self) -> "AsyncEmbeddingCache":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
