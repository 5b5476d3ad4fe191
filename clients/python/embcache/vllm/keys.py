"""What a vLLM item's key commits to.

vLLM names each multimodal item by an identifier (``MultiModalFeatureSpec.
identifier``): by default a BLAKE3 hash of the model id, the item's media
and the request's processor kwargs (vLLM's ``MultiModalHasher``), with a
LoRA prefix where one applies; or a string the user supplied
(``multi_modal_uuids``), which vLLM takes as it is. vLLM's own encoder
cache lives in one engine, whose config is fixed, so that is enough there.
A cluster-wide cache is shared by engines whose revision, processor
defaults, dtype or weights may differ, so the key here is the identifier's
bytes (raw-bytes mode) under a preprocessing config built from the
engine's: every field below is part of it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Mapping, Optional, Tuple

from ..key import EncoderPreprocessingConfig

# The modalities vLLM names that an encoder's output is cached for, as the
# preprocessing config spells them.
MODALITIES = ("image", "video", "audio")


def canonical_hash(value: Any) -> str:
    """A stable hash of a JSON-like value (sorted keys, no spaces), for
    the config fields that summarise a whole config."""
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
    return "sha256:" + hashlib.sha256(data.encode()).hexdigest()


def dtype_name(dtype: Any) -> str:
    """vLLM's dtype (``torch.bfloat16``, "auto", a string) as a name."""
    s = str(dtype)
    return s[len("torch."):] if s.startswith("torch.") else s


def _positive_pair(a: Any, b: Any) -> Optional[Tuple[int, int]]:
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool) \
            and a > 0 and b > 0:
        return a, b
    return None


def image_size_of(processor: Mapping[str, Any]) -> Tuple[Tuple[int, int], str]:
    """The size the processor resizes to, and how it resizes: a fixed
    (width, height); else its (longest, shortest) edges; else its
    (max, min) pixels (dynamic resolution, as Qwen2-VL's); else (1, 1),
    "dynamic". The processor's whole config is hashed into the key too
    (processor_version): these fields summarise it, they do not replace it."""
    size = processor.get("size")
    sized = size if isinstance(size, Mapping) else {"width": size, "height": size}
    for source, a, b, how in ((sized, "width", "height", "fixed"), (sized, "longest_edge", "shortest_edge", "edges"),
                              (sized, "max_pixels", "min_pixels", "pixels"),
                              (sized, "shortest_edge", "shortest_edge", "shortest-edge"),
                              (processor, "max_pixels", "min_pixels", "pixels")):
        pair = _positive_pair(source.get(a), source.get(b))
        if pair:
            return pair, how
    return (1, 1), "dynamic"


def _floats(v: Any, default: Tuple[float, ...]) -> Tuple[float, ...]:
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return tuple(float(x) for x in v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (float(v),)
    return default


def preprocessing_config(*, model_id: str, revision: Optional[str], hf_config: Mapping[str, Any],
                         processor: Mapping[str, Any], mm_processor_kwargs: Optional[Mapping[str, Any]],
                         dtype: Any, modality: str, tenant: str, weight_epoch: int = 0,
                         versions: Optional[Mapping[str, str]] = None) -> EncoderPreprocessingConfig:
    """The preprocessing config of modality's items in an engine:

    - model_id, model_revision: the engine's model and revision ("unpinned"
      when it has none: then weights changed under the same name are told
      apart only by weight_epoch, which the operator raises with
      ``embcache invalidate``);
    - encoder_config_hash: the model's HF config and the engine's dtype;
    - processor_version: the vLLM and transformers versions (``versions``)
      and a hash of the processor's config (its image processor, feature
      extractor or video processor) and the engine's mm_processor_kwargs;
    - the modality's own fields, read from the processor's config (image
      size and normalisation; an audio sample rate, which audio must have);
    - input_dtype: the engine's dtype; tenant and weight_epoch as given.
    """
    if modality not in MODALITIES:
        raise ValueError(f"modality {modality!r}: want one of {', '.join(MODALITIES)}")
    dtype_s = dtype_name(dtype)
    summary: Dict[str, Any] = {"processor": dict(processor), "mm_processor_kwargs": dict(mm_processor_kwargs or {})}
    version = ";".join(f"{k}={v}" for k, v in sorted((versions or {}).items()))
    fields: Dict[str, Any] = dict(
        model_id=model_id, model_revision=revision or "unpinned",
        encoder_config_hash=canonical_hash({"hf_config": dict(hf_config), "dtype": dtype_s}),
        processor_version=f"{version};{canonical_hash(summary)}" if version else canonical_hash(summary),
        modality=modality, tenant=tenant, weight_epoch=weight_epoch, input_dtype=dtype_s)
    if modality in ("image", "video"):
        size, how = image_size_of(processor)
        kind = str(processor.get("image_processor_type") or processor.get("video_processor_type") or "hf")
        mean, std = _floats(processor.get("image_mean"), ()), _floats(processor.get("image_std"), ())
        if not mean or not std:
            raise ValueError(f"{modality} items cannot be keyed without the image processor's image_mean and "
                             f"image_std (the processor config has {processor.get('image_mean')!r}, "
                             f"{processor.get('image_std')!r}): give its whole config")
        if len(std) != len(mean) or not all(std):
            raise ValueError(f"the processor's image_std {std} does not match its image_mean {mean}")
        fields.update(resize_mode=f"{kind}:{how}", image_size=size,
                      crop_mode="center" if processor.get("do_center_crop") else "none",
                      normalize_mean=mean, normalize_std=std,
                      video_frame_stride=1 if modality == "video" else 0)
    else:
        rate = processor.get("sampling_rate")
        if not isinstance(rate, int) or isinstance(rate, bool) or rate <= 0:
            raise ValueError("audio items cannot be keyed without the feature extractor's sampling_rate "
                             f"(the processor config has {rate!r})")
        fields.update(audio_sample_rate=rate,
                      audio_codec_version=str(processor.get("feature_extractor_type") or "hf"),
                      audio_codec_config_hash=canonical_hash(dict(processor)))
    return EncoderPreprocessingConfig(**fields)
