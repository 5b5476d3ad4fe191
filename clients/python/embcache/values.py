"""Values: what compute_fn returns and the cache holds, and how a hit is
read (Embedding, a view of the agent's shared-memory file)."""

from __future__ import annotations

import collections
import math
import mmap
import numbers
import os
import threading
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from .key import EmbeddingCacheKey
from .errors import EmbcacheError, InvalidValue

if TYPE_CHECKING:  # pragma: no cover
    import numpy
    import torch

try:  # optional: hits become arrays over the mapping
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is absent
    _np = None  # type: ignore[assignment]


class Tensor(NamedTuple):
    """A tensor without numpy: contiguous little-endian bytes."""

    data: Any  # bytes-like
    dtype: str  # float32, float16, bfloat16, float64, int8, uint8, int16, int32, int64, bool
    shape: Sequence[int]


class Tokens(NamedTuple):
    """A token-id value (codec tokens of a voice reference, say)."""

    ids: Sequence[int]


class HiddenPrefix(NamedTuple):
    """Token ids and the hidden states of their prefix (a numpy array,
    torch tensor or Tensor)."""

    tokens: Sequence[int]
    hidden: Any


Value = Union[Tensor, Tokens, HiddenPrefix, Any]  # or a numpy array or torch tensor

_NUMPY_DTYPES = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "int8": "i1", "uint8": "u1",
                 "int16": "<i2", "int32": "<i4", "int64": "<i8", "bool": "?", "bfloat16": "<u2"}
_FROM_NUMPY = {"float32": "float32", "float16": "float16", "float64": "float64", "int8": "int8", "uint8": "uint8",
               "int16": "int16", "int32": "int32", "int64": "int64", "bool": "bool"}
_MAX_TOKEN = (1 << 32) - 1


class Parts(NamedTuple):
    """What a commit sends: kind, tensor bytes (in a slot), dtype, shape,
    tokens."""

    kind: str
    data: Any  # bytes-like
    dtype: str
    shape: Tuple[int, ...]
    tokens: List[int]


def parts_of(value: Any, dtype: Optional[str] = None, shape: Optional[Sequence[int]] = None) -> Parts:
    """The parts of a value; InvalidValue for one the cache cannot hold."""
    if isinstance(value, Tokens):
        return Parts("tokens", b"", "", (), _token_list(value.ids))
    if isinstance(value, HiddenPrefix):
        data, dt, sh = tensor_parts(value.hidden, dtype, shape)
        return Parts("hidden-prefix", data, dt, sh, _token_list(value.tokens))
    data, dt, sh = tensor_parts(value, dtype, shape)
    return Parts("tensor", data, dt, sh, [])


def _integers(values: Any, what: str) -> List[int]:
    """values as ints; refused unless each is an integer (int(1.9) is 1: a
    float, a forgotten cast, would key another input). A numpy array or
    torch tensor gives its elements as Python numbers."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        out: List[int] = []
        for v in values:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise InvalidValue(f"{what} are integers, not {type(v).__name__} ({v!r})")
            out.append(int(v))
    except TypeError as e:
        raise InvalidValue(f"{what}: {e}") from e
    return out


def _token_list(ids: Sequence[int]) -> List[int]:
    """ids as ints in [0, 2**32), or InvalidValue."""
    out = _integers(ids, "token ids")
    if any(t < 0 or t > _MAX_TOKEN for t in out):
        raise InvalidValue("token ids must be in [0, 2**32)")
    return out


def _dims(shape: Sequence[Any]) -> Tuple[int, ...]:
    """shape as non-negative ints, or InvalidValue."""
    out = _integers(shape, "shape dimensions")
    if any(d < 0 for d in out):
        raise InvalidValue(f"shape {tuple(out)} has a negative dimension")
    return tuple(out)


def _reshaped(own: Tuple[int, ...], shape: Optional[Sequence[int]]) -> Tuple[int, ...]:
    """The shape a value is keyed and stored under: its own, or shape if
    given and it holds as many elements (any other is refused, never
    dropped: the key would be the value's own shape's)."""
    if shape is None:
        return own
    sh = _dims(shape)
    if math.prod(sh) != math.prod(own):
        raise InvalidValue(f"shape {sh} does not hold the value's {math.prod(own)} elements (shape {own})")
    return sh


def _own_dtype(own: Optional[str], dtype: Optional[str], what: str, holds_bf16: bool) -> str:
    """The dtype a value is keyed under: its own; dtype if given must be it
    (bfloat16 bits may lie in 16-bit integers). Keyed under another dtype,
    a value's bytes would be another tensor's (int32 1 is float32 1e-45)."""
    if dtype is not None and dtype != own and not (dtype == "bfloat16" and holds_bf16):
        raise InvalidValue(f"{what} cannot be a {dtype} value (only 16-bit integers hold bfloat16 bits)")
    name = dtype or own
    if name is None:
        raise InvalidValue(f"{what} has no embcache dtype name; pass dtype=")
    return name


_FLOAT_FORMATS = {"e": "float16", "f": "float32", "d": "float64", "?": "bool"}


def _check_buffer(data: Any, dtype: str) -> None:
    """Refuses bytes-like data that cannot be dtype as it lies: big-endian,
    not contiguous, or typed as another dtype (a float64 buffer read as
    float32). Untyped bytes ('B', 'c') may be any dtype."""
    try:
        mv = memoryview(data)
    except TypeError as e:
        raise InvalidValue(f"tensor data: {e}") from e
    with mv:
        fmt = mv.format
        if fmt[:1] in (">", "!"):
            raise InvalidValue(f"tensor data in big-endian format {fmt!r}: values are little-endian")
        if not mv.c_contiguous:
            raise InvalidValue("tensor data is not C-contiguous: pass a contiguous copy")
        char = fmt.lstrip("<=@")
        if char in ("B", "c"):
            return
        if char in _FLOAT_FORMATS:
            name: Optional[str] = _FLOAT_FORMATS[char]
        elif char in ("b", "h", "i", "l", "q", "n"):
            name = f"int{mv.itemsize * 8}"
        elif char in ("H", "I", "L", "Q", "N"):
            name = f"uint{mv.itemsize * 8}"
        else:
            name = None
        if name != dtype and not (dtype == "bfloat16" and mv.itemsize == 2 and name in ("int16", "uint16")):
            raise InvalidValue(f"tensor data in format {fmt!r} cannot be a {dtype} value")


def tensor_parts(value: Any, dtype: Optional[str], shape: Optional[Sequence[int]]) -> Tuple[Any, str, Tuple[int, ...]]:
    """(bytes-like, dtype name, shape) of a numpy array, torch tensor or
    Tensor (or bytes, with dtype and shape). A dtype or shape given with a
    value is checked against the value's own: a shape of as many elements
    reshapes it; anything else is InvalidValue."""
    if isinstance(value, Tensor):
        own = _dims(value.shape)
        name = _own_dtype(value.dtype, dtype, f"a {value.dtype} Tensor", value.dtype in ("int16", "uint16"))
        if _np is not None and isinstance(value.data, _np.ndarray):
            # Checked as an array is: its own dtype and byte order, not its bytes as they lie.
            data, name, own = tensor_parts(value.data, name, own)
        else:
            _check_buffer(value.data, name)
            data = value.data
        return data, name, _reshaped(own, shape)
    mod = type(value).__module__
    if mod.startswith("torch"):
        import torch

        t = value.detach().contiguous().cpu()
        own_name = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            arr = t.view(torch.int16).numpy()
        elif own_name in _NUMPY_DTYPES:
            arr = t.numpy()
        else:
            raise InvalidValue(f"torch dtype {t.dtype} has no embcache name")
        name = _own_dtype(own_name, dtype, f"a torch {t.dtype} tensor", own_name in ("int16", "uint16"))
        return arr.data, name, _reshaped(tuple(int(d) for d in t.shape), shape)
    if _np is not None and isinstance(value, _np.ndarray):
        a = _np.ascontiguousarray(value)  # at least 1-d: the shape is value's (a 0-d array is not [x])
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        name = _own_dtype(_FROM_NUMPY.get(a.dtype.name), dtype, f"a numpy {a.dtype} array",
                          a.dtype.name in ("uint16", "int16"))
        return a.data, name, _reshaped(tuple(int(d) for d in value.shape), shape)
    if isinstance(value, (bytes, bytearray, memoryview)) and dtype is not None and shape is not None:
        _check_buffer(value, dtype)
        return value, dtype, _dims(shape)
    raise InvalidValue(f"a value of type {type(value).__name__}: want a numpy array, a torch tensor, Tensor, "
                       "Tokens or HiddenPrefix (or bytes with dtype= and shape=)")


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
        if self.dtype not in _NUMPY_DTYPES:
            raise EmbcacheError(f"a {self.kind} value has no tensor (dtype {self.dtype!r}): see .tokens")
        arr = _np.frombuffer(self.buffer, dtype=_np.dtype(_NUMPY_DTYPES[self.dtype]))
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

        if self.dtype not in _NUMPY_DTYPES:
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

