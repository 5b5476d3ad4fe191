"""Client of the embcache node agent.

An encoder stage asks the node's agent (``embcache agent``, one per node)
for the embedding of an input. A hit comes back as a read-only mapping of
the agent's shared-memory file (a numpy array or torch tensor over it when
those are importable, without a copy); a miss as a reservation: this
process computes, and the agent shares the result with every process of
the cluster.

    from embcache import EmbeddingCache, EncoderPreprocessingConfig

    cache = EmbeddingCache("/run/embcache/agent.sock")
    key = cache.key_from_raw_bytes(config, jpeg_bytes)
    emb = cache.get_or_compute(key, lambda: encoder(pixels), request_id)
    ...
    cache.cleanup_request(request_id)
"""

__version__ = "0.2.0"

from .aio import AsyncEmbeddingCache
from .client import EmbeddingCache, Reservation
from .embedding import Embedding
from .errors import (
    AgentTimeout,
    AgentUnavailable,
    UntrustedAgent,
    AnswerMismatch,
    APIError,
    BadRequest,
    ComputeTimeout,
    EmbcacheError,
    InvalidValue,
    LeaseLost,
    ReservationEnded,
    StoreFull,
    StoreUnavailable,
)
from .key import EmbeddingCacheKey, EncoderPreprocessingConfig
from .stage import StageCacheConfig
from .values import HiddenPrefix, Tensor, Tokens

__all__ = [
    "AgentTimeout",
    "AgentUnavailable",
    "UntrustedAgent",
    "AnswerMismatch",
    "APIError",
    "AsyncEmbeddingCache",
    "BadRequest",
    "ComputeTimeout",
    "EmbcacheError",
    "Embedding",
    "EmbeddingCache",
    "EmbeddingCacheKey",
    "EncoderPreprocessingConfig",
    "HiddenPrefix",
    "InvalidValue",
    "LeaseLost",
    "Reservation",
    "ReservationEnded",
    "StageCacheConfig",
    "StoreFull",
    "StoreUnavailable",
    "Tensor",
    "Tokens",
]
