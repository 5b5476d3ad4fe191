"""Connections to the agent's Unix socket, and the pool a process keeps."""

from __future__ import annotations

import mmap
import os
import socket
import struct
import threading
import time
import weakref
from typing import FrozenSet, List, Mapping, Optional, Tuple

from .errors import AgentTimeout, AgentUnavailable, AnswerMismatch, UntrustedAgent

# An answer's header block, and a body without a length, are bounded.
_MAX_HEADER = 1 << 20
# Bodies above this are sent with a second send, not copied into one buffer.
_JOIN_BELOW = 64 << 10
# The socket's send buffer asked for (see _connect).
_SEND_BUFFER = 4 << 20


class ProtocolError(AgentUnavailable):
    """The agent's answer is not the HTTP this client speaks."""


def check_peer(s: socket.socket, path: str, trusted: FrozenSet[int]) -> None:
    """Raises UntrustedAgent unless the process listening on s (its
    credentials when it listened: SO_PEERCRED) runs as this process's user,
    as root, or as a user in trusted. A socket path is no proof of who
    listens on it: the agent refuses a directory another user may write,
    but a client cannot tell whether the agent started at all."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:  # not Linux: the agent does not run there
        return
    fmt = "iII"  # pid, uid, gid
    pid, uid, _ = struct.unpack(fmt, s.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize(fmt)))
    me = os.geteuid()
    if uid in (0, me) or uid in trusted:
        return
    raise UntrustedAgent(
        f"the process on {path} (pid {pid}) runs as uid {uid}, not this process's user ({me}), root, "
        f"nor agent_uid {sorted(trusted)}: nothing was sent to it")


class Connection:
    """One HTTP/1.1 connection to the agent's Unix socket. Written by hand
    rather than with http.client, whose header parsing costs more than the
    rest of a hit: a call here is one or two sends and, for the agent's
    small answers, one recv, parsed with bytes methods.

    HTTP/1.1 has no request ids: the answer to a call is simply the next
    answer on the socket. So a connection makes one call at a time (its
    user holds it alone: the pool hands it to one caller), and names each
    call (the Embcache-Call header, which the agent echoes): an answer
    naming another call means someone else uses the socket, and is refused.
    Any failure closes the connection: what is left on its stream is not
    known."""

    def __init__(self, path: str, client: str = "", trusted: FrozenSet[int] = frozenset()):
        self.path = path
        self.client = client  # sent with every call (Embcache-Client): the agent keeps its pins while we are open
        self.trusted = trusted  # users the agent may run as, besides ours and root (agent_uid)
        self.sock: Optional[socket.socket] = None
        self.buf = b""
        self.name = os.urandom(8).hex()  # random: unique among every process's connections
        self.calls = 0
        # The agent's key slot for this connection (POST /v1/key/slot): its
        # name and this process's writable mapping of it.
        self.key_slot: Optional[Tuple[str, mmap.mmap]] = None

    def _connect(self, timeout: float) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # A key's input (megabytes) goes into the kernel in one copy
            # instead of a ping-pong through the default ~200 KiB, which the
            # agent's hash waits on. The kernel caps it (net.core.wmem_max);
            # memory is only used while bytes are queued.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        except OSError:
            pass
        s.settimeout(timeout)
        try:
            s.connect(self.path)
            check_peer(s, self.path, self.trusted)
        except BaseException:
            s.close()
            raise
        self.sock, self.buf = s, b""
        return s

    def request(self, method: str, target: str, body: object = b"", *, timeout: float,
                content_type: str = "application/json", headers: Optional[Mapping[str, str]] = None,
                total: Optional[float] = None) -> Tuple[int, bytes]:
        """Makes one call; returns (status, body). body is bytes-like (sent
        without a copy when large). timeout bounds each wait for the agent;
        total, if given, the whole call, whose 1xx answers (heartbeats) are
        skipped. Raises AgentTimeout past either, AgentUnavailable for a
        socket that fails, AnswerMismatch for an answer to another call;
        each closes the connection."""
        try:
            return self._request(method, target, body, timeout, content_type, headers, total)
        except AnswerMismatch:
            self.close()
            raise
        except socket.timeout as e:
            self.close()
            raise AgentTimeout(f"agent at {self.path}: no answer to {method} {target} in {timeout:g}s "
                               "(it hangs, or is overloaded)") from e
        except AgentUnavailable:
            self.close()
            raise
        except (FileNotFoundError, ConnectionRefusedError) as e:
            self.close()
            raise AgentUnavailable(f"agent at {self.path}: {method} {target}: {e} "
                                   "(no agent listens there: is `embcache agent --socket` running, with this path?)") from e
        except (OSError, ValueError) as e:
            self.close()
            raise AgentUnavailable(f"agent at {self.path}: {method} {target}: {e}") from e

    def _request(self, method: str, target: str, body: object, timeout: float, content_type: str,
                 headers: Optional[Mapping[str, str]], total: Optional[float]) -> Tuple[int, bytes]:
        sock = self.sock
        if sock is None:
            sock = self._connect(timeout)
        else:
            sock.settimeout(timeout)
        self.calls += 1
        call = f"{self.name}.{self.calls}"
        data = memoryview(body).cast("B") if not isinstance(body, bytes) else body  # type: ignore[arg-type]
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if self.client:
            extra += f"Embcache-Client: {self.client}\r\n"
        head = (f"{method} {target} HTTP/1.1\r\nHost: agent\r\nContent-Type: {content_type}\r\n{extra}"
                f"Embcache-Call: {call}\r\nContent-Length: {len(data)}\r\n\r\n").encode("ascii")
        if len(data) < _JOIN_BELOW:
            sock.sendall(head + bytes(data))
        else:
            sock.sendall(head)
            sock.sendall(data)
        deadline = time.monotonic() + total if total is not None else None
        status, echoed, answer = self._read_answer()
        while 100 <= status < 200:  # a heartbeat: the agent is alive, the answer comes later
            if deadline is not None and time.monotonic() > deadline:
                raise AgentTimeout(f"agent at {self.path}: {method} {target} got no answer in {total:g}s")
            status, echoed, answer = self._read_answer()
        if echoed != call.encode("ascii"):
            raise AnswerMismatch(f"agent at {self.path}: {method} {target} was call {call}, the answer is to "
                                 f"call {echoed.decode(errors='replace') or '(none named)'}")
        return status, answer

    def _fill(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ProtocolError(f"agent at {self.path}: connection closed mid-answer")
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > _MAX_HEADER:
                raise ProtocolError("header line too long")
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _read_answer(self) -> Tuple[int, bytes, bytes]:
        """Reads one answer: (status, the call it names, body)."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > _MAX_HEADER:
                raise ProtocolError("answer headers too long")
            self._fill()
        header, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = header.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {lines[0]!r}")
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
                while len(self.buf) <= _MAX_HEADER:
                    self._fill()
            except ProtocolError:
                pass
            data, self.buf, close = self.buf, b"", True
        if close:
            self.close()
        return status, echoed, data

    def _read_chunked(self) -> bytes:
        out: List[bytes] = []
        while True:
            size = int(self._line().split(b";")[0], 16)
            if size == 0:
                while self._line():
                    pass  # trailers
                return b"".join(out)
            out.append(self._take(size))
            self._take(2)

    @property
    def closed(self) -> bool:
        return self.sock is None

    def close(self) -> None:
        """Closes this process's descriptor of the socket. Not a shutdown():
        in a forked child, whose descriptor is a copy of its parent's, the
        parent's connection stays up (the agent sees a connection end when
        its last descriptor closes)."""
        sock, self.sock, self.buf = self.sock, None, b""
        slot, self.key_slot = self.key_slot, None
        if sock is not None:
            sock.close()
        if slot is not None:
            try:
                slot[1].close()
            except BufferError:  # a key call was interrupted while copying into it: unmapped when collected
                pass


class Pool:
    """The connections of one process: a call takes an idle one (or opens
    one) and gives it back; at most max_idle are kept open between calls, so
    a burst of threads leaves no more than that behind. The agent keeps a
    client's pins while any of its connections is open, and releases them
    when the last closes: the pool keeps one open while it is in use.

    It belongs to the process that made it: a forked child must disown an
    inherited pool (its sockets are the parent's) and make its own."""

    def __init__(self, path: str, max_idle: int, client: str = "", trusted: FrozenSet[int] = frozenset()):
        self.path = path
        self.client = client
        self.trusted = trusted
        self.max_idle = max(1, max_idle)
        self.lock = threading.Lock()
        self.idle: List[Connection] = []
        # Handed out to a caller; weak, so that a Reservation dropped
        # without a commit closes its connection when it is collected.
        self.busy: "weakref.WeakSet[Connection]" = weakref.WeakSet()
        self.doomed: "weakref.WeakSet[Connection]" = weakref.WeakSet()  # busy at close(): closed when given back

    def take(self) -> Connection:
        with self.lock:
            c = self.idle.pop() if self.idle else Connection(self.path, self.client, self.trusted)
            self.busy.add(c)
            return c

    def give(self, c: Connection) -> None:
        """Gives c back: kept for the next call, or closed."""
        with self.lock:
            self.busy.discard(c)
            doomed = c in self.doomed
            self.doomed.discard(c)
            if not doomed and not c.closed and len(self.idle) < self.max_idle:
                self.idle.append(c)
                return
        c.close()

    def open_count(self) -> int:
        with self.lock:
            return sum(1 for c in self.idle if not c.closed) + sum(1 for c in self.busy if not c.closed)

    def close(self) -> None:
        """Closes the idle connections; a busy one closes when given back
        (its call goes on undisturbed)."""
        with self.lock:
            idle, self.idle = self.idle, []
            self.doomed |= self.busy
        for c in idle:
            c.close()

    def disown(self) -> None:
        """In a forked child: closes the child's copies of the parent's
        sockets, taking no lock (a thread of the parent may have held it at
        fork()) and touching nothing the parent uses."""
        for c in list(self.idle) + list(self.busy):
            c.close()
