"""What a client does when the cache fails: raise (strict), or serve the
call without the cache, counting the failure and logging it once per
episode (degrade)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .errors import BadRequest, EmbcacheError, with_value

log = logging.getLogger("embcache")

# The least time between two lines of the degrade log.
_QUIET = 30.0


class Policy:
    """store_unavailable_mode in one process. failed() is told of each
    failure of the cache: in strict mode it raises the error (carrying the
    computed value, if any); in degrade mode it counts it, and the call
    goes on without the cache. ok() is told of each success.

    Degrade mode logs by episode: the first failure is logged, the ones
    after it only counted, and the first success after them ends the
    episode. An episode's lines are at least _QUIET apart: a store outage
    under which local hits keep succeeding would otherwise start and end an
    episode with every pair of calls."""

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.lock = threading.Lock()
        self.failing = False
        self.unreported = 0  # failures not yet in a "served again" line
        self.total = 0
        self.logged = -_QUIET  # monotonic time of the last line

    def failed(self, what: str, err: EmbcacheError, value: Any = None) -> None:
        """what (a call) failed with err. BadRequest is raised in both
        modes: a wrong key or value is a bug to fix, not an outage to ride
        out."""
        if self.strict or isinstance(err, BadRequest):
            raise with_value(err, value)
        now = time.monotonic()
        with self.lock:
            self.total += 1
            self.unreported += 1
            report = not self.failing and now - self.logged >= _QUIET
            self.failing = True
            if report:
                self.logged = now
        if report:
            log.warning("embcache: %s failed; calls are served without the cache while it fails: %s", what, err)

    def ok(self) -> None:
        if not self.failing:  # unlocked read: a stale view only delays the line by one call
            return
        now = time.monotonic()
        with self.lock:
            # The episode ends with its line: one held back by the quiet
            # rule comes with a later success (ending it here silently
            # left an outage shorter than _QUIET without its end).
            report = self.failing and now - self.logged >= _QUIET
            n = self.unreported
            if report:
                self.failing, self.unreported, self.logged = False, 0, now
        if report:
            log.warning("embcache: the cache serves again; %d calls were served without it", n)
