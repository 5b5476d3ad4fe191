"""Per-process state: what a client holds in one process, and the at-fork
hook that gives each live client a state of its own in a forked child."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable, FrozenSet, TypeVar

from .connection import Pool

T = TypeVar("T")


class ProcessState:
    """What a client holds in one process: the identity the agent keeps its
    pins under, and its pool of connections.

    It belongs to the process that made it (pid). A forked child inherits a
    copy, which it must not use: the sockets are its parent's, so the two
    processes' calls would interleave on them and each would read answers
    to the other's calls; and under the parent's identity, either one's
    cleanup_request (or exit) would drop the other's pins. Nor may the
    child take its locks: one held at fork() by another thread of the
    parent stays held in the child forever."""

    def __init__(self, client_id: str, path: str, max_idle: int, trusted: FrozenSet[int] = frozenset()):
        self.pid = os.getpid()
        self.client_id = client_id
        self.pool = Pool(path, max_idle, client_id, trusted)


# Every live client and what it does in a forked child, so that a child
# disowns their inherited connections before it runs anything else.
_hooks: "weakref.WeakKeyDictionary[Any, Callable[[Any], object]]" = weakref.WeakKeyDictionary()
# Serializes giving clients a state in a new process (see entering).
_enter_lock = threading.Lock()


def at_fork(owner: T, enter: Callable[[T], object]) -> None:
    """Calls enter(owner) in every forked child, first thing, for as long as
    owner lives."""
    _hooks[owner] = enter


def entering() -> threading.Lock:
    """The lock a client holds while it takes a state in a new process.
    Each child has a new one: a thread of the parent may have held the
    parent's at fork(), and no thread of the child would release it."""
    return _enter_lock


def _after_fork_in_child() -> None:
    global _enter_lock
    _enter_lock = threading.Lock()
    for owner, enter in list(_hooks.items()):
        enter(owner)


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
