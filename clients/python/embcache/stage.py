"""StageCacheConfig: a process's ``embedding_cache`` block."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional


@dataclass(frozen=True)
class StageCacheConfig:
    """A process's settings for the client and its agent, as an
    ``embedding_cache`` block of its own config (vLLM and vLLM-Omni use
    embcache.vllm instead, configured by ``ec_transfer_config``: docs/vllm.md).
    Off unless enable_embedding_cache."""

    enable_embedding_cache: bool = False
    store_unavailable_mode: str = "degrade"  # degrade | strict
    agent_socket: str = "/run/embcache/agent.sock"
    request_timeout_s: float = 300.0  # a compute, and the wait for another process's
    agent_timeout_s: float = 5.0  # any exchange with the agent
    lease_ttl_s: float = 5.0
    store_ttl_s: float = 3600.0
    local_max_bytes: int = 0
    shm_max_bytes: int = 0

    def __post_init__(self) -> None:
        # YAML and JSON hand over what the file says: "false" is a string,
        # and a string here would turn the cache on. Types are checked.
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            want = {"bool": (bool,), "str": (str,), "float": (int, float), "int": (int,)}[str(f.type)]
            if not isinstance(v, want) or (bool not in want and isinstance(v, bool)):
                raise TypeError(f"embedding_cache.{f.name}: {v!r} is a {type(v).__name__}, want a {f.type}")
        if self.store_unavailable_mode not in ("degrade", "strict"):
            raise ValueError(f"store_unavailable_mode {self.store_unavailable_mode!r}: want degrade or strict")
        if not all(0 < t <= 86400 * 365 for t in (self.request_timeout_s, self.agent_timeout_s, self.lease_ttl_s,
                                                  self.store_ttl_s)):  # also refuses NaN and infinity
            raise ValueError("timeouts and TTLs must be positive")
        if not 1 <= self.store_ttl_s <= 86400:
            # The agent refuses it: a value's last event must outlive it (docs/protocol.md 4.1).
            raise ValueError(f"store_ttl_s {self.store_ttl_s}: want 1 s to 24 h")
        if self.local_max_bytes < 0 or self.shm_max_bytes < 0:
            raise ValueError("budgets must be >= 0 (0: the agent's default)")

    @classmethod
    def from_stage_config(cls, stage: Optional[Mapping[str, Any]]) -> "StageCacheConfig":
        """Reads the ``embedding_cache`` block of a parsed stage config, or
        the block itself. A stage without the block, or with an empty one
        (YAML ``embedding_cache:`` and nothing under it), has the cache
        off. A mapping that names some of the block's fields is read as the
        block, and any other key in it is an error (a misspelt field would
        otherwise be dropped)."""
        if not stage:
            return cls()
        if not isinstance(stage, Mapping):
            raise TypeError(f"a stage config is a mapping, not a {type(stage).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        if "embedding_cache" in stage:
            block = stage["embedding_cache"]
            if block is None:
                return cls()
            if not isinstance(block, Mapping):
                raise TypeError(f"embedding_cache: {block!r} is a {type(block).__name__}, want a mapping")
        elif names & set(stage):
            block = stage
        else:
            return cls()  # a stage without the block
        unknown = sorted(set(block) - names)
        if unknown:
            raise ValueError(f"embedding_cache: unknown keys {unknown}")
        return cls(**block)

    def agent_args(self) -> List[str]:
        """The ``embcache agent`` flags these settings stand for: the agent
        owns TTLs and budgets, the stage only names them."""
        args = ["--socket", self.agent_socket, "--lease-ttl", f"{self.lease_ttl_s}s", "--store-ttl", f"{self.store_ttl_s}s",
                "--compute-timeout", f"{self.request_timeout_s}s"]
        if self.strict:
            args.append("--strict")
        if self.local_max_bytes:
            args += ["--local-max-bytes", str(self.local_max_bytes)]
        if self.shm_max_bytes:
            args += ["--shm-max-bytes", str(self.shm_max_bytes)]
        return args

    @property
    def strict(self) -> bool:
        return self.store_unavailable_mode == "strict"
