"""Values: what compute_fn returns and the cache holds (a numpy array, a
torch tensor, Tensor, Tokens, HiddenPrefix), and how a commit sends one
(parts_of). A hit is read as an Embedding (embedding.py)."""

from __future__ import annotations

import math
import numbers
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

from .errors import InvalidValue

try:  # optional: arrays are values
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

# embcache's tensor dtypes, as numpy reads them (bfloat16, which numpy lacks, as its bits).
NUMPY_DTYPES = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "int8": "i1", "uint8": "u1",
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
        return Parts("tokens", b"", "", (), token_list(value.ids))
    if isinstance(value, HiddenPrefix):
        data, dt, sh = tensor_parts(value.hidden, dtype, shape)
        return Parts("hidden-prefix", data, dt, sh, token_list(value.tokens))
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


def token_list(ids: Sequence[int]) -> List[int]:
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
        elif own_name in NUMPY_DTYPES:
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
