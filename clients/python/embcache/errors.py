"""The client's errors: one type per failure a caller may handle."""

from __future__ import annotations

from typing import Any, Optional


class EmbcacheError(Exception):
    """Base of the client's errors. Raised by a call in strict mode (in
    degrade mode, get_or_compute returns the computed value instead). An
    error raised after compute_fn ran carries its result as ``value``."""

    value: Any = None


class AgentUnavailable(EmbcacheError):
    """The agent's socket cannot be reached, or a call got no answer."""


class UntrustedAgent(AgentUnavailable):
    """The process listening on the agent's socket runs as a user this
    client does not trust to be its agent: neither this process's user, nor
    root, nor agent_uid. Nothing is sent to it (it would read the inputs
    keyed, and could answer with any value): the connection is closed, and
    in degrade mode get_or_compute computes instead."""


class AgentTimeout(AgentUnavailable):
    """The agent did not answer within its timeout (agent_timeout, or
    compute_timeout plus agent_timeout for a lookup that may wait for
    another process's compute): the agent hangs or is overloaded."""


class AnswerMismatch(EmbcacheError):
    """An answer names another call, key, reservation, client or request
    than the one asked. It is refused, never taken as a value (it would be
    another input's embedding), and the connection it came on is closed: the
    agent then releases that connection's reservations, and the next call
    opens a new one. It means that something else writes to this
    connection, or that the agent answered another question (or is older
    than these checks: its answers name no call)."""


class InvalidValue(EmbcacheError, TypeError):
    """compute_fn returned (or put was given) a value the cache cannot
    hold: not a numpy array, torch tensor, Tensor, Tokens or HiddenPrefix,
    or one whose dtype has no embcache name."""


class APIError(EmbcacheError):
    """The agent answered a call with an error (its status and code)."""

    def __init__(self, status: int, code: str, message: str):
        message = message.removeprefix("agent: ")
        super().__init__(f"agent: {status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class BadRequest(APIError, ValueError):
    """The agent refused the call's content (400): a config that lacks a
    field or names an unknown one, a value whose bytes do not match its
    dtype and shape. Never degraded for keys: it is the caller's bug."""


class StoreUnavailable(APIError, AgentUnavailable):
    """The agent cannot reach the cluster's store (NATS) and runs in strict
    mode (503, code unavailable)."""


class StoreFull(APIError):
    """The agent's shared-memory store has no room for the value (503, code
    no_space)."""


class ComputeTimeout(APIError):
    """A compute ran past the agent's --compute-timeout: this process's
    reservation was taken back before the commit (410), or the wait for
    another process's compute ended (504)."""


class ReservationEnded(APIError):
    """The reservation has ended (410): it was committed or abandoned, or
    its connection closed."""


class LeaseLost(APIError):
    """The agent lost the key's lease before the value was committed (409):
    another process may compute it."""


_BY_CODE = {"bad_request": BadRequest, "unavailable": StoreUnavailable, "no_space": StoreFull,
            "compute_timeout": ComputeTimeout, "reservation_ended": ReservationEnded, "conflict": LeaseLost}


def api_error(status: int, code: str, message: str) -> APIError:
    """The typed error of an agent's error answer."""
    cls = _BY_CODE.get(code, APIError)
    return cls(status, code, message)


def with_value(err: EmbcacheError, value: Optional[Any]) -> EmbcacheError:
    """err, carrying the value compute_fn returned."""
    err.value = value
    return err
