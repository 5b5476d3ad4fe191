"""Embedding: a hit, read as a view of the agent's shared-memory file
without a copy; and the process's mappings of those files (Mappings)."""

from __future__ import annotations

import collections
import mmap
import os
import threading
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from .errors import EmbcacheError
from .key import EmbeddingCacheKey
from .values import NUMPY_DTYPES

if TYPE_CHECKING:  # pragma: no cover
    import numpy
    import torch

try:  # optional: hits become arrays over the mapping
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is absent
    _np = None  # type: ignore[assignment]


class Mappings:
    """The agent's files this process has mapped, by path and checksum. A hit
    of a value already mapped takes a new view of the same pages instead of
    mapping the file again: the checksum names the bytes, so the pages are
    the value's even if the file has since been unlinked. Bounded by mapped
    bytes; a mapping the bound drops is unmapped when its last view goes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._lru: "collections.OrderedDict[str, Tuple[Tuple[mmap.mmap, Tuple[int, int]], str]]" = \
            collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def after_fork(self) -> None:
        """In a forked child: the mappings stay valid (a child inherits its
        parent's mappings), but a thread of the parent may have held the
        lock at fork(), and no thread of the child would ever release it."""
        self._lock = threading.Lock()

    def get(self, file: str, checksum: str, need: int) -> Tuple[mmap.mmap, Tuple[int, int]]:
        """A read-only mapping of file, and the file's (device, inode)."""
        with self._lock:
            hit = self._lru.get(file)
            if hit is not None and hit[1] == checksum and len(hit[0][0]) >= need:
                self._lru.move_to_end(file)
                return hit[0]
        mm, ident = map_file(file, need, mmap.ACCESS_READ)
        size = len(mm)
        # The file ends with the checksum of its encoding (docs/protocol.md
        # 2.3), which the agent verified: a file replaced since the answer
        # (the key computed again, to other bytes) is not this value.
        if size < 32 or mm[size - 32:] != bytes.fromhex(checksum):
            mm.close()
            raise EmbcacheError(f"hit file {file} no longer holds the value the agent answered (checksum {checksum}): "
                                "replaced since; ask again")
        with self._lock:
            old = self._lru.pop(file, None)
            if old is not None:
                self._bytes -= len(old[0][0])
            if self.max_bytes > 0:
                self._lru[file] = ((mm, ident), checksum)
                self._bytes += size
            while self._bytes > self.max_bytes and self._lru:
                _, ((dropped, _), _) = self._lru.popitem(last=False)
                self._bytes -= len(dropped)  # unmapped by its last reference
        return mm, ident


def map_file(file: str, need: int, access: int) -> Tuple[mmap.mmap, Tuple[int, int]]:
    """Maps the whole of file (at least need bytes long); returns the
    mapping and the file's (device, inode)."""
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError as e:
        raise EmbcacheError(f"the hit's file cannot be opened here (is the agent's shm directory this "
                            f"process's too?): {e}") from e
    try:
        st = os.fstat(fd)
        if need > st.st_size:
            raise EmbcacheError(f"hit needs {need} bytes of {file}, which has {st.st_size}")
        if st.st_size == 0:
            raise EmbcacheError(f"hit file {file} is empty")
        return mmap.mmap(fd, st.st_size, access=access), (st.st_dev, st.st_ino)
    except OSError as e:
        raise EmbcacheError(f"the hit's file {file} cannot be mapped: {e}") from e
    finally:
        os.close(fd)


class Embedding:
    """A hit: the value's tensor data mapped read-only from the agent's
    shared-memory file, without a copy. It stays valid while this object is
    open (the mapping outlives the file); the request's pin, until
    cleanup_request, keeps the value in the cache."""

    def __init__(self, key: EmbeddingCacheKey, value: Dict[str, Any], path: str, mappings: Optional[Mappings] = None):
        self.key = key
        self.path = path  # how the agent got it: local-hit, remote-hit, waited, computed, ...
        self.file: str = value["file"]
        self.dtype: str = value.get("dtype", "")
        self.shape: Tuple[int, ...] = tuple(value.get("shape") or ())
        self.kind: str = value["kind"]
        self.tokens: Tuple[int, ...] = tuple(value.get("tokens") or ())
        self.checksum: str = value["checksum"]
        offset, length = int(value["offset"]), int(value["length"])
        if offset < 0 or length < 0:
            raise EmbcacheError(f"hit [{offset}, +{length}) of {self.file}")
        self._offset, self._length = offset, length
        self._mmap: Optional[mmap.mmap]
        self._mmap, self._ident = (mappings or Mappings(0)).get(self.file, self.checksum, offset + length)
        whole = memoryview(self._mmap)
        self.buffer: memoryview = whole[offset:offset + length]  # read-only
        self._views = [whole, self.buffer]

    @property
    def offset(self) -> int:
        """Where the value's data begins in its file."""
        return self._offset

    @property
    def length(self) -> int:
        """The value's data's length in bytes."""
        return self._length

    def numpy(self) -> "numpy.ndarray[Any, Any]":
        """A read-only numpy array over the mapping (no copy). bfloat16,
        which numpy lacks, comes back as uint16."""
        if _np is None:
            raise EmbcacheError("numpy is not installed")
        if self.dtype not in NUMPY_DTYPES:
            raise EmbcacheError(f"a {self.kind} value has no tensor (dtype {self.dtype!r}): see .tokens")
        arr = _np.frombuffer(self.buffer, dtype=_np.dtype(NUMPY_DTYPES[self.dtype]))
        return arr.reshape(self.shape) if self.shape else arr

    def torch(self, clone: bool = False) -> "torch.Tensor":
        """A torch tensor of the value. torch has no read-only tensors, so
        the tensor lies over a private copy-on-write mapping of the file:
        no copy is made to read it, and a write changes only this tensor's
        pages (copied by the kernel as they are written), never the cache's
        value nor another view of it. clone=True returns an ordinary copy
        instead. If the file is gone or replaced (the request's pin
        released, the value evicted), the tensor is a copy."""
        import torch

        if self.dtype not in NUMPY_DTYPES:
            raise EmbcacheError(f"a {self.kind} value has no tensor (dtype {self.dtype!r}): see .tokens")
        data: Any = None
        if not clone and self._length > 0:
            try:
                private, ident = map_file(self.file, self._offset + self._length, mmap.ACCESS_COPY)
                if ident == self._ident:  # the file this hit mapped, not another at its path
                    data = memoryview(private)[self._offset:self._offset + self._length]
            except EmbcacheError:
                pass
        if data is None:
            data = bytearray(self.buffer)
        if len(data) == 0:
            t = torch.empty(0, dtype=getattr(torch, self.dtype))
        elif self.dtype == "bfloat16":
            t = torch.frombuffer(data, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(data, dtype=getattr(torch, self.dtype))
        return t.reshape(self.shape)

    def tobytes(self) -> bytes:
        """A copy of the tensor data."""
        return self.buffer.tobytes()

    def close(self) -> None:
        """Releases this view. The mapping may serve later hits of the same
        value; it is unmapped once the client drops it and no view is left.
        Arrays from numpy() keep the pages mapped while they live."""
        for v in reversed(self._views):
            try:
                v.release()
            except (BufferError, ValueError):  # still exported (an array over it): freed with it
                pass
        self._views = []
        self._mmap = None

    def __enter__(self) -> "Embedding":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Embedding({self.key}, {self.kind} {self.dtype}{list(self.shape)}, {self.path})"
