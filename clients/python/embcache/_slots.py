"""Slot IO: the shared-memory files a client writes for its agent, instead
of sending their bytes through the socket. A commit's value goes into a
value slot (a file the agent reads once); a key's input into the key slot
of the connection (a mapping kept for the connection's life)."""

from __future__ import annotations

import errno
import logging
import mmap
import os
from typing import Any

from .errors import AgentUnavailable, StoreFull

log = logging.getLogger("embcache")

# Inputs from KEY_SLOT_MIN to key_slot_max_bytes are keyed through the
# connection's key slot: one copy into shared memory, against two through
# the kernel for a body (a 2 MiB key: ~1.7 ms against ~2.4 ms here). Below,
# a body costs as little; above, a slot would hold that much RAM per pooled
# connection, and the agent hashes a body as it arrives anyway. Slots grow
# in steps of KEY_SLOT_STEP.
KEY_SLOT_MIN = 32 << 10
KEY_SLOT_STEP = 1 << 20


class SlotUnusable(AgentUnavailable):
    """This process cannot map its connection's key slot."""


def flat(data: Any) -> memoryview:
    """data as a flat memoryview of bytes, without a copy (an empty one for
    an empty tensor, whose zero-dimension shape a cast refuses)."""
    mv = memoryview(data)
    if mv.nbytes == 0:
        mv.release()
        return memoryview(b"")
    return mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv


def write_all(fd: int, path: str, mv: memoryview) -> None:
    """Writes mv at the start of fd and closes it; a failure (a full
    tmpfs, say) removes path (if given) and is StoreFull or
    AgentUnavailable. write(2) moves at most ~2 GiB at a time: it loops."""
    try:
        done = 0
        while done < mv.nbytes:
            done += os.write(fd, mv[done:])
    except OSError as e:
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass
        if e.errno == errno.ENOSPC:
            raise StoreFull(503, "no_space", f"slot: {e}") from e
        raise AgentUnavailable(f"slot: {e}") from e
    finally:
        os.close(fd)


def create_value(path: str, mv: memoryview) -> bool:
    """Makes the value slot file a lookup's answer named, holding mv: 0640
    (with the agent's --shm-group, that group reads it; no other process
    can write it). False if this process cannot make it (the caller asks
    the agent for a slot instead); a failed write removes it and raises."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    except OSError as e:
        log.debug("embcache: slot file %s: %s; asking the agent for one", path, e)
        return False
    write_all(fd, path, mv)
    return True


def fill_value(path: str, mv: memoryview) -> None:
    """Writes mv into a value slot file the agent made."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        raise AgentUnavailable(f"slot {path}: {e}") from e
    write_all(fd, "", mv)


def key_slot_size(n: int) -> int:
    """The size of a key slot that holds n bytes."""
    return -(-n // KEY_SLOT_STEP) * KEY_SLOT_STEP


def map_key_slot(path: str, size: int) -> mmap.mmap:
    """A writable mapping of a key slot file the agent made (OSError if it
    cannot be mapped here)."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
