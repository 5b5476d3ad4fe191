"""EmbcacheECConnector: embcache as vLLM's encoder-cache (EC) connector.

vLLM loads it with ``--ec-transfer-config '{"ec_connector":
"EmbcacheECConnector", "ec_connector_module_path": "embcache.vllm",
"ec_role": "ec_both", "ec_connector_extra_config": {...}}'`` and makes one
per role: one in the scheduler process, one in each worker (one per rank).

Where each decision is made (docs/vllm.md):
- The scheduler decides hit or miss, once per item, for every rank. For a
  waiting request, ``ensure_cache_available`` starts a lookup per item on
  a thread and defers the request until every lookup has answered: a hit
  (pinned under the item until the last request using it finishes), or a
  reservation (this engine computes the item: every other engine's
  lookup waits for it), or a failure (the item is computed here, unshared).
  ``has_cache_item`` then answers from what the lookup said, at once.
- Every rank loads a hit from the agent's shared-memory file
  (``start_load_caches``); a miss is computed by vLLM's own batched
  encoder on every rank.
- Only TP rank 0 of the engine holding the reservation saves: it hands the
  tensor to a bounded publisher, which writes it into the reservation's
  slot file and commits it on a thread of its own (``save_caches``): the
  forward waits for nothing but the device-to-host copy.
- A reservation the worker did not commit (a publish dropped or failed, a
  rank that died) is given back by the scheduler when the last request
  using it finishes (after ``abandon_grace_s``, so that a commit on its way
  lands first), or by the agent when the engine's connection closes.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from ..client import EmbeddingCache, Reservation
from ..embedding import Embedding
from ..errors import EmbcacheError
from ..key import EmbeddingCacheKey, EncoderPreprocessingConfig
from ._base import ECConnectorBase, ECConnectorMetadata, ECConnectorRole
from .keys import MODALITIES, preprocessing_config
from .publisher import BoundedPublisher

log = logging.getLogger("embcache.vllm")

# ec_connector_extra_config: the settings and their defaults.
DEFAULTS: Dict[str, Any] = {
    "agent_socket": None,  # default $EMBCACHE_AGENT_SOCKET
    "tenant": None,  # required
    "weight_epoch": 0,
    "processors": None,  # {"image": {...}, "audio": {...}}: the processors' configs (default: from transformers)
    "store_unavailable_mode": "degrade",
    "agent_timeout_s": 5.0,
    "compute_timeout_s": 300.0,
    "lookup_threads": 16,
    "publish_threads": 2,
    "publish_max_bytes": 1 << 30,  # host copies waiting to be committed, on a worker
    "abandon_grace_s": 30.0,  # after a save is sent, how long until the scheduler gives its reservation back
}


@dataclass(frozen=True)
class LoadSpec:
    """A hit every rank loads: the agent's file and where the value lies in it."""

    identifier: str
    value: Dict[str, Any]  # file, offset, length, kind, dtype, shape, checksum (an agent hit's "value")
    key: Dict[str, Any]  # the key's wire form


@dataclass(frozen=True)
class SaveSpec:
    """A miss this engine computes and rank 0 commits."""

    identifier: str
    reservation: str
    slot_file: str
    request_id: str  # the reservation's (the item's pin name)
    key: Dict[str, Any]


@dataclass
class EmbcacheConnectorMetadata(ECConnectorMetadata):  # type: ignore[misc]
    loads: List[LoadSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)


@dataclass
class _Item:
    """What the scheduler knows of one item (an identifier): a lookup in
    flight, or its answer (a hit, this engine's reservation, or "off":
    computed here unshared), or nothing (looked up again when next needed:
    a reservation whose save was sent ends with its commit, after which the
    item is a hit)."""

    pin: str  # the request id the agent keeps its pins and reservation under
    lookup: Optional["Future[Tuple[str, Any, Any]]"] = None
    key: Optional[EmbeddingCacheKey] = None
    hit: Optional[Dict[str, Any]] = None
    reservation: Optional[Reservation] = None
    off: bool = False
    requests: Set[str] = field(default_factory=set)


def _extra(vllm_config: Any) -> Dict[str, Any]:
    transfer = vllm_config.ec_transfer_config
    extra = dict(getattr(transfer, "ec_connector_extra_config", None) or {})
    unknown = sorted(set(extra) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"ec_connector_extra_config: unknown keys {unknown} (known: {sorted(DEFAULTS)})")
    out = dict(DEFAULTS)
    out.update(extra)
    if not out["tenant"]:
        raise ValueError("ec_connector_extra_config: tenant is required")
    return out


def _versions() -> Dict[str, str]:
    out = {}
    for name in ("vllm", "transformers"):
        try:
            out[name] = str(importlib.import_module(name).__version__)
        except ImportError:
            pass
    return out


def processor_configs(model_config: Any) -> Dict[str, Dict[str, Any]]:
    """Each modality's processor config, as transformers loads the model's
    processor (vLLM depends on transformers). Untested here: neither is
    installed on the machine the tests run on; pass "processors" in the
    extra config to key with configs of your own."""
    auto = importlib.import_module("transformers").AutoProcessor
    proc = auto.from_pretrained(model_config.model, revision=getattr(model_config, "revision", None),
                                trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)))
    out: Dict[str, Dict[str, Any]] = {}
    for attr, modality in (("image_processor", "image"), ("video_processor", "video"), ("feature_extractor", "audio")):
        sub = getattr(proc, attr, None)
        if sub is not None and hasattr(sub, "to_dict"):
            out[modality] = dict(sub.to_dict())
    if "video" not in out and "image" in out:
        out["video"] = out["image"]
    return out


def _tp_rank(vllm_config: Any) -> int:
    try:
        return int(importlib.import_module("vllm.distributed.parallel_state").get_tensor_model_parallel_rank())
    except (ImportError, AssertionError, AttributeError):
        pc = getattr(vllm_config, "parallel_config", None)
        tp = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        return int(getattr(pc, "rank", 0) or 0) % tp


def _device(vllm_config: Any) -> Any:
    dc = getattr(vllm_config, "device_config", None)
    return getattr(dc, "device", None) or "cpu"


def pin_name(identifier: str, n: int) -> str:
    """The request id the agent keeps an item's pins and reservation
    under: one per item while requests use it (n tells apart its turns:
    the release of one, which runs on a thread, never takes the next's)."""
    return f"ec-{hashlib.sha256(identifier.encode()).hexdigest()[:40]}-{n}"


class EmbcacheECConnector(ECConnectorBase):  # type: ignore[misc]
    """embcache as vLLM's EC connector: one per engine in the scheduler
    (role SCHEDULER) and one per rank in the workers (WORKER), built by
    vLLM from ec_transfer_config (the module's doc and docs/vllm.md).
    vllm_config is vLLM's; the fields it reads are in docs/vllm.md
    "Driving it without vLLM". Refuses an extra config with an unknown key,
    without a tenant, or (the scheduler) whose processors cannot key an
    item (ValueError)."""

    def __init__(self, vllm_config: Any, role: Any):
        super().__init__(vllm_config, role)
        self._settings = _extra(vllm_config)
        s = self._settings
        self._cache = EmbeddingCache(s["agent_socket"], store_unavailable_mode=s["store_unavailable_mode"],
                                     agent_timeout=s["agent_timeout_s"], compute_timeout=s["compute_timeout_s"])
        self._lock = threading.Lock()
        self._counts: Dict[str, int] = {"hits": 0, "reserved": 0, "lookup_failures": 0, "unseen": 0,
                                        "loads": 0, "saves": 0}
        if role == ECConnectorRole.SCHEDULER:
            self._init_scheduler(vllm_config)
        else:
            self._rank = _tp_rank(vllm_config)
            self._device = _device(vllm_config)
            self._publisher = BoundedPublisher(s["publish_threads"], s["publish_max_bytes"])

    # -- scheduler side -------------------------------------------------

    def _init_scheduler(self, vllm_config: Any) -> None:
        s = self._settings
        mc = vllm_config.model_config
        processors = s["processors"] if s["processors"] is not None else processor_configs(mc)
        versions = _versions()
        hf = mc.hf_config.to_dict() if hasattr(mc.hf_config, "to_dict") else dict(mc.hf_config)
        self._configs: Dict[str, EncoderPreprocessingConfig] = {}
        for modality, proc in processors.items():
            if modality not in MODALITIES:
                raise ValueError(f"processors: {modality!r}: want one of {', '.join(MODALITIES)}")
            self._configs[modality] = preprocessing_config(
                model_id=mc.model, revision=getattr(mc, "revision", None), hf_config=hf, processor=proc,
                mm_processor_kwargs=getattr(mc, "mm_processor_kwargs", None), dtype=mc.dtype, modality=modality,
                tenant=s["tenant"], weight_epoch=s["weight_epoch"], versions=versions)
        self._lookups = ThreadPoolExecutor(max_workers=s["lookup_threads"], thread_name_prefix="embcache-lookup")
        self._items: Dict[str, _Item] = {}
        self._requests: Dict[str, Any] = {}
        self._loads: Dict[str, LoadSpec] = {}
        self._to_abandon: List[Tuple[float, Reservation]] = []
        self._turns = itertools.count()

    def _lookup(self, identifier: str, modality: str, pin: str) -> Tuple[str, Any, Any]:
        """On a lookup thread: ("hit", key, value), ("reserved", key,
        Reservation) or ("off", key or None, why)."""
        config = self._configs.get(modality)
        if config is None:
            return "off", None, f"no processor config for {modality}"
        try:
            key = self._cache.key_from_raw_bytes(config, identifier.encode())
            if key is None:
                return "off", None, "the cache is off or degraded"
            got = self._cache.reserve(key, pin)
        except EmbcacheError as e:
            return "off", None, str(e)
        if isinstance(got, Embedding):
            value = {"file": got.file, "offset": got.offset, "length": got.length, "kind": got.kind,
                     "dtype": got.dtype, "shape": list(got.shape), "checksum": got.checksum}
            got.close()
            return "hit", key, value
        return "reserved", key, got

    def _settle(self, item: _Item) -> bool:
        """Takes a finished lookup's answer into item; False while it runs."""
        if item.lookup is None:
            return True
        if not item.lookup.done():
            return False
        status, key, got = item.lookup.result()
        item.lookup, item.key = None, key
        if status == "hit":
            item.hit = got
            self._count("hits")
        elif status == "reserved":
            item.reservation = got
            self._count("reserved")
        else:
            item.off = True
            self._count("lookup_failures")
            n = self.stats()["lookup_failures"]
            if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th...: never silent, never a flood
                log.warning("embcache: an item computed here, unshared (%d so far): %s", n, got)
        return True

    def _look_up(self, item: _Item, identifier: str, modality: str) -> None:
        if item.lookup is None and item.hit is None and item.reservation is None and not item.off:
            item.lookup = self._lookups.submit(self._lookup, identifier, modality, item.pin)

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        """Starts a lookup of each of request's items not looked up yet;
        True once each has answered (hit, reservation, or a failure: then
        the item is computed here)."""
        self._requests[request.request_id] = request
        ready = True
        for f in request.mm_features:
            if f.modality not in MODALITIES:
                continue
            pos = f.mm_position
            if pos.offset + pos.length <= num_computed_tokens:
                continue  # its tokens are computed (a prefix cache hit): not needed
            item = self._items.get(f.identifier)
            if item is None:
                item = _Item(pin=pin_name(f.identifier, next(self._turns)))
                self._items[f.identifier] = item
            self._look_up(item, f.identifier, f.modality)
            item.requests.add(request.request_id)
            ready = self._settle(item) and ready
        return ready

    def has_cache_item(self, identifier: str) -> bool:
        """Whether every rank loads the item instead of computing it: its
        lookup was a hit. An item no lookup was started for (a vLLM that
        does not call ensure_cache_available) is computed, unshared."""
        item = self._items.get(identifier)
        if item is None:
            self._count("unseen")
            return False
        self._settle(item)
        return item.hit is not None

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        f = request.mm_features[index]
        item = self._items.get(f.identifier)
        if item is not None and item.hit is not None and item.key is not None:
            self._loads[f.identifier] = LoadSpec(f.identifier, item.hit, item.key.to_wire())

    def build_connector_meta(self, scheduler_output: Any) -> EmbcacheConnectorMetadata:
        meta = EmbcacheConnectorMetadata(loads=list(self._loads.values()))
        self._loads.clear()
        for req_id, indices in (getattr(scheduler_output, "scheduled_encoder_inputs", None) or {}).items():
            request = self._requests.get(req_id)
            if request is None:
                continue
            for i in indices:
                ident = request.mm_features[i].identifier
                item = self._items.get(ident)
                if item is None or item.reservation is None or item.key is None:
                    continue
                r = item.reservation
                meta.saves.append(SaveSpec(ident, r.id, r.slot_file, r.request_id, item.key.to_wire()))
                # The commit ends the reservation; if it never comes (rank 0
                # dropped or failed the publish, or died), the scheduler
                # gives it back after the grace. The item is looked up again
                # when next needed: a hit once the commit has landed.
                item.reservation = None
                self._to_abandon.append((time.monotonic() + self._settings["abandon_grace_s"], r))
        self._abandon_due(time.monotonic())
        return meta

    def request_finished(self, request: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """Ends request's use of its items: an item no request uses any
        more is unpinned, and its reservation (if rank 0 did not commit
        it) given back after the grace."""
        self._requests.pop(request.request_id, None)
        for f in request.mm_features:
            item = self._items.get(f.identifier)
            if item is None:
                continue
            item.requests.discard(request.request_id)
            if item.requests:
                continue
            del self._items[f.identifier]
            self._end(item)
        return False, None

    def _end(self, item: _Item) -> None:
        """Gives back what item holds, on a lookup thread: the scheduler
        waits for no agent call."""
        if item.lookup is not None:  # still waiting: its answer, when it comes, is given back
            item.lookup.add_done_callback(lambda fut: self._give_back(item.pin, fut.result()))
            return
        reservation = item.reservation  # reserved, never scheduled for the encoder

        def end() -> None:
            if reservation is not None:
                self._give_up(reservation, "no request needs the item any more")
            self._release(item.pin)  # its pins, from every lookup of it that hit

        self._lookups.submit(end)

    def _release(self, pin: str) -> None:
        try:
            self._cache.cleanup_request(pin)
        except EmbcacheError as e:  # strict mode: the agent ends the pins with the connection
            log.warning("embcache: releasing %s failed: %s", pin, e)

    def _give_back(self, pin: str, answer: Tuple[str, Any, Any]) -> None:
        status, _, got = answer
        if status == "reserved":
            self._give_up(got, "no request needs the item any more")
        elif status == "hit":
            self._release(pin)

    def _abandon_due(self, now: float) -> None:
        due = [r for t, r in self._to_abandon if t <= now]
        self._to_abandon = [(t, r) for t, r in self._to_abandon if t > now]
        for r in due:
            # Committed by rank 0 meanwhile: the agent answers that it ended
            # (committed), and nothing is given back. On a lookup thread.
            self._lookups.submit(self._give_up, r, "the engine did not commit the item")

    def update_connector_output(self, connector_output: Any) -> None:
        return None

    # -- worker side ----------------------------------------------------

    def start_load_caches(self, encoder_cache: Dict[str, Any], **kwargs: Any) -> None:
        """Puts every hit of this step into encoder_cache, on the model's
        device, read from the agent's file (verified against its checksum)."""
        meta = self._get_connector_metadata()
        for load in meta.loads:
            if load.identifier in encoder_cache:
                continue
            key = EmbeddingCacheKey(load.key["key"], load.key["tenant"], load.key["model"], load.key["weight_epoch"])
            with Embedding(key, load.value, "ec-load") as emb:
                t = emb.torch()
            encoder_cache[load.identifier] = t.to(self._device, non_blocking=True)
            self._count("loads")

    def save_caches(self, encoder_cache: Dict[str, Any], mm_hash: str, **kwargs: Any) -> None:
        """Rank 0 of the engine that reserved mm_hash hands its tensor to
        the publisher (a device-to-host copy first, on a GPU); others return."""
        if not self.is_producer or self._rank != 0 or self._connector_metadata is None:
            return
        spec = next((s for s in self._connector_metadata.saves if s.identifier == mm_hash), None)
        if spec is None:
            return
        t = encoder_cache[mm_hash].detach()
        done: Optional[Any] = None
        if t.device.type == "cuda":
            torch: Any = importlib.import_module("torch")
            host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            host.copy_(t, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            t = host
        key = EmbeddingCacheKey(spec.key["key"], spec.key["tenant"], spec.key["model"], spec.key["weight_epoch"])
        res = Reservation(self._cache, key, spec.reservation, spec.request_id, None, spec.slot_file)

        def publish() -> None:
            if done is not None:
                done.synchronize()
            res.commit(t.contiguous())
            self._count("saves")

        nbytes = t.numel() * t.element_size()
        self._publisher.submit(f"item {mm_hash}", nbytes, publish, lambda why: self._give_up(res, why))

    # -- both -----------------------------------------------------------

    def _give_up(self, r: Reservation, why: str) -> None:
        """Abandons r unless it has ended (committed, or ended by the agent);
        a failure is logged: the agent ends it when the connection holding
        it closes, or at its compute timeout."""
        try:
            r.abandon(why)
        except EmbcacheError as e:
            log.debug("embcache: abandon of %s failed: %s", r, e)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def stats(self) -> Dict[str, Any]:
        """This connector's counters (and its publisher's, on a worker)."""
        with self._lock:
            out: Dict[str, Any] = dict(self._counts)
        if hasattr(self, "_publisher"):
            out["publisher"] = self._publisher.stats()
        if hasattr(self, "_items"):
            out["items"] = len(self._items)
        return out

    def shutdown(self) -> None:
        """Gives back what this connector holds: pins, reservations; a
        worker's publisher finishes what it took first."""
        if hasattr(self, "_publisher"):
            self._publisher.close()
        if hasattr(self, "_items"):
            for item in list(self._items.values()):
                self._end(item)
            self._items.clear()
            self._abandon_due(float("inf"))
            self._lookups.shutdown(wait=True)
        self._cache.close()
