"""vLLM's EC connector base class, or a stand-in with its behaviour where
vLLM is not installed (the package imports without vLLM; its tests drive
the connector as vLLM does).

The stand-in follows vllm/distributed/ec_transfer/ec_connector/base.py
(vllm-project/vllm at 035e2dd3a4b5edaa4c3f3ab98795f6e34eebf2c6): the
constructor's checks, the metadata binding, and the defaults of the
optional methods.
"""

from __future__ import annotations

import enum
import importlib
from typing import Any, Optional, Tuple


def _vllm() -> Optional[Any]:
    try:
        return importlib.import_module("vllm.distributed.ec_transfer.ec_connector.base")
    except ImportError:
        return None


class StandInRole(enum.Enum):
    SCHEDULER = 0  # the connector in the scheduler process
    WORKER = 1  # the connector in each worker (one per rank)


class StandInMetadata:
    """vLLM's ECConnectorMetadata: what the scheduler sends every worker."""


class StandInBase:
    """vLLM's ECConnectorBase, less its abstract methods."""

    def __init__(self, vllm_config: Any, role: Any):
        self._connector_metadata: Optional[Any] = None
        self._vllm_config = vllm_config
        self._role = role
        transfer = getattr(vllm_config, "ec_transfer_config", None)
        if transfer is None:
            raise ValueError("ec_transfer_config must be set for ECConnectorBase")
        self._is_producer = bool(transfer.is_ec_producer)
        self._is_consumer = bool(transfer.is_ec_consumer)

    @property
    def role(self) -> Any:
        return self._role

    @property
    def is_producer(self) -> bool:
        return self._is_producer

    @property
    def is_consumer(self) -> bool:
        return self._is_consumer

    def shutdown(self) -> None:
        return None

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> Any:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def register_caches(self, ec_caches: Any) -> None:
        return None

    def get_finished(self, finished_req_ids: Any) -> Tuple[Optional[Any], Optional[Any]]:
        return None, None

    def build_connector_worker_meta(self) -> Any:
        return None

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        return True

    def update_connector_output(self, connector_output: Any) -> None:
        return None

    def request_finished(self, request: Any) -> Tuple[bool, Optional[Any]]:
        return False, None


_real = _vllm()
HAVE_VLLM = _real is not None
ECConnectorBase: Any = _real.ECConnectorBase if _real is not None else StandInBase
ECConnectorMetadata: Any = _real.ECConnectorMetadata if _real is not None else StandInMetadata
ECConnectorRole: Any = _real.ECConnectorRole if _real is not None else StandInRole
