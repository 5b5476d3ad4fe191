"""A bounded, asynchronous publisher of computed values (the RFC's
_BoundedPublisher): the forward hands a value over and goes on; a few
threads write it into its slot and commit it. The values waiting are
bounded by their bytes (host copies of 8-100 MB tensors): one that does
not fit is dropped (logged, counted, its reservation given back so that
another engine computes the key), never waited for by the forward."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict

log = logging.getLogger("embcache.vllm")


class BoundedPublisher:
    def __init__(self, workers: int = 2, max_bytes: int = 1 << 30):
        if workers < 1 or max_bytes < 1:
            raise ValueError(f"workers={workers}, max_bytes={max_bytes}: want both >= 1")
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="embcache-publish")
        self._max = max_bytes
        self._lock = threading.Lock()
        self._queued = 0  # bytes taken and not yet published; guarded by _lock
        self._counts: Dict[str, int] = {"published": 0, "dropped": 0, "failed": 0}

    def submit(self, what: str, nbytes: int, publish: Callable[[], None], give_up: Callable[[str], None]) -> bool:
        """Runs publish on a publisher thread, unless the values waiting
        and this one's nbytes would exceed max_bytes (one value alone is
        always taken): then give_up(reason) runs here, and it is counted as
        dropped. A publish that raises is logged and counted, and give_up
        runs on the publisher thread. False if dropped."""
        with self._lock:
            fits = self._queued == 0 or self._queued + nbytes <= self._max
            if fits:
                self._queued += nbytes
            else:
                self._counts["dropped"] += 1
        if not fits:
            log.warning("embcache: publish queue full (%d bytes waiting), %s not shared (another engine computes it)",
                        self._max, what)
            give_up("publish queue full")
            return False

        def run() -> None:
            try:
                publish()
                self._count("published")
            except Exception as e:  # a thread's exception would be lost otherwise
                self._count("failed")
                log.warning("embcache: publish of %s failed: %s", what, e)
                try:
                    give_up(f"publish failed: {e}")
                except Exception as e2:
                    log.debug("embcache: giving %s up failed too: %s", what, e2)
            finally:
                with self._lock:
                    self._queued -= nbytes

        self._pool.submit(run)
        return True

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def stats(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def close(self, wait: bool = True) -> None:
        """Stops taking values; with wait, returns once those taken are published."""
        self._pool.shutdown(wait=wait)

    def __enter__(self) -> "BoundedPublisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
