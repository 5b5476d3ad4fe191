"""embcache for vLLM: an encoder-cache (EC) connector that shares each
multimodal item's encoder output across every engine of a cluster.

    vllm serve MODEL --ec-transfer-config '{"ec_connector": "EmbcacheECConnector",
        "ec_connector_module_path": "embcache.vllm", "ec_role": "ec_both",
        "ec_connector_extra_config": {"tenant": "acme"}}'

docs/vllm.md says what runs where and what a key commits to. The module
imports without vLLM (its base class is then a stand-in with vLLM's
behaviour, which the tests drive as vLLM does).
"""

from ._base import HAVE_VLLM, ECConnectorRole
from .connector import EmbcacheConnectorMetadata, EmbcacheECConnector, LoadSpec, SaveSpec, pin_name
from .keys import preprocessing_config
from .publisher import BoundedPublisher

__all__ = [
    "HAVE_VLLM",
    "ECConnectorRole",
    "BoundedPublisher",
    "EmbcacheConnectorMetadata",
    "EmbcacheECConnector",
    "LoadSpec",
    "SaveSpec",
    "pin_name",
    "preprocessing_config",
]
