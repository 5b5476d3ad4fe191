"""Keys: the preprocessing config an input is keyed under, and the key.

Keys are made by the agent (it hashes the input, so a key is exactly the
one Go computes); this module only holds them. It imports nothing of the
client: a KeySource is whatever makes keys (an EmbeddingCache)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Protocol, Sequence, Tuple


@dataclass(frozen=True)
class EncoderPreprocessingConfig:
    """Every parameter that changes what the encoder produces for an input.

    The RFC's fields plus the modality, the weight epoch and the tenant. All
    of them are part of the key, and the agent refuses a config that lacks
    one: a field left out would let two different preprocessings share
    a key (a silent false hit). Field names are those of docs/protocol.md.
    """

    model_id: str
    model_revision: str
    encoder_config_hash: str
    processor_version: str
    modality: str  # image, video, audio, tokens
    tenant: str
    cache_schema_version: int = 1
    resize_mode: str = ""
    image_size: Tuple[int, int] = (0, 0)  # width, height
    crop_mode: str = ""
    normalize_mean: Tuple[float, ...] = ()
    normalize_std: Tuple[float, ...] = ()
    audio_sample_rate: int = 0
    audio_codec_version: str = ""
    audio_codec_config_hash: str = ""
    video_frame_stride: int = 0
    input_dtype: str = ""
    weight_epoch: int = 0

    def __post_init__(self) -> None:
        # Each field is checked for its type here, by name, as the agent
        # checks it (docs/protocol.md 1.1): a "3" for an epoch is refused at
        # the call that made it, not as a 400 far from it. Ranges and
        # per-modality rules stay the agent's.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if str(f.type) == "str" and not isinstance(value, str):
                raise TypeError(_wrong_type(f.name, "a str", value))
            if str(f.type) == "int" and not _is_int(value):
                raise TypeError(_wrong_type(f.name, "an int", value))
        # Lists from JSON or YAML become tuples: the config stays hashable.
        # None stands for an empty normalize list, as in the protocol.
        for name in ("image_size", "normalize_mean", "normalize_std"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (list, tuple)):
                raise TypeError(_wrong_type(name, "a list", value))
            object.__setattr__(self, name, tuple(value or ()))
        if not all(_is_int(v) for v in self.image_size):
            raise TypeError(_wrong_type("image_size", "two ints (width, height)", self.image_size))
        if len(self.image_size) != 2:
            raise ValueError(f"preprocessing config: image_size: {self.image_size!r}: want two values (width, height)")
        for name in ("normalize_mean", "normalize_std"):
            for v in getattr(self, name):
                if not (_is_int(v) or isinstance(v, float)):
                    raise TypeError(_wrong_type(name, "a list of numbers", v))

    def to_wire(self) -> Dict[str, Any]:
        """The config as the agent takes it: every field, by its wire name."""
        d = dataclasses.asdict(self)
        for name in ("image_size", "normalize_mean", "normalize_std"):
            d[name] = list(d[name])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EncoderPreprocessingConfig":
        """A config from its JSON form (a config file), read as strictly as
        the agent and `embcache key` read it (docs/protocol.md 1.1): every
        field present under its exact name, nothing else. A field left out
        is refused, not defaulted: a default would key a config the file's
        author did not write. The constructor keeps its defaults for code."""
        for f in dataclasses.fields(cls):
            if f.name not in d:
                raise ValueError(f"preprocessing config: {f.name}: missing (every field is part of the key)")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"preprocessing config: {unknown[0]!r}: unknown field (names are exact, lower case)")
        return cls(**d)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _wrong_type(name: str, want: str, value: Any) -> str:
    return f"preprocessing config: {name}: want {want}, got {type(value).__name__} {value!r}"


_HEX64 = re.compile("[0-9a-f]{64}")


@dataclass(frozen=True)
class EmbeddingCacheKey:
    """The content-addressed key of an input (BLAKE3, 256 bits) and what
    the agent needs besides: the tenant, and the model and weight epoch
    (kept with the value so that a weight update invalidates it).

    Keys are made by the agent (see EmbeddingCache.key_from_raw_bytes), so
    they are exactly the keys Go computes.

    The RFC's constructors, from_raw_bytes and from_decoded_tensor, take
    the input first and the config second, as their names read ("the key
    from raw bytes, under config"); the client's key_from_* take the config
    first, as all three of them do (key_from_tokens has no constructor
    here), because a stage keys every input under one config
    (functools.partial(cache.key_from_raw_bytes, config)). Both orders are
    kept: they are public, and swapping either would break its callers.
    """

    key: str  # 64 hex digits
    tenant: str
    model: str = ""
    weight_epoch: int = 0
    prefix_keys: Tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if len(self.key) != 64 or not _HEX64.fullmatch(self.key):
            raise ValueError(f"key {self.key!r}: want 64 lowercase hex digits")

    @classmethod
    def from_raw_bytes(cls, raw_bytes: Any, config: EncoderPreprocessingConfig, *,
                       cache: KeySource) -> Optional[EmbeddingCacheKey]:
        """The RFC's preferred mode: the key of raw input bytes (a JPEG, a
        WAV), made by cache's agent (None where the cache is off or
        degraded)."""
        return cache.key_from_raw_bytes(config, raw_bytes)

    @classmethod
    def from_decoded_tensor(cls, tensor: Any, config: EncoderPreprocessingConfig, *, cache: KeySource,
                            dtype: Optional[str] = None,
                            shape: Optional[Sequence[int]] = None) -> Optional[EmbeddingCacheKey]:
        """The RFC's fallback mode: the key of a decoded tensor (its dtype
        and shape are part of the key)."""
        return cache.key_from_decoded_tensor(config, tensor, dtype=dtype, shape=shape)

    def to_wire(self) -> Dict[str, Any]:
        return {"key": self.key, "tenant": self.tenant, "model": self.model, "weight_epoch": self.weight_epoch}

    def __str__(self) -> str:
        return f"{self.tenant}/{self.key}"


class KeySource(Protocol):
    """What makes keys for EmbeddingCacheKey's constructors: an
    EmbeddingCache (named by its two calls, so that keys need no client)."""

    def key_from_raw_bytes(self, config: EncoderPreprocessingConfig, data: Any) -> Optional[EmbeddingCacheKey]: ...

    def key_from_decoded_tensor(self, config: EncoderPreprocessingConfig, tensor: Any, dtype: Optional[str] = None,
                                shape: Optional[Sequence[int]] = None) -> Optional[EmbeddingCacheKey]: ...
