"""Where the embcache call goes in an encoder forward (vllm-omni style).

A multimodal model's encoder stage turns each item (an image, a video clip,
an audio clip) into an embedding tensor that the prefill stage consumes.
The hook wraps that per-item forward: the key is made from the item's raw
bytes and every preprocessing parameter, and the forward runs only in the
one process of the cluster that the cache picks; every other process maps
the result from shared memory (no copy until .to(device)).

Wire it where the model computes its multimodal embeddings, for example in
a Qwen2.5-Omni thinker:

    class Qwen2_5OmniThinker...:
        def _process_image_input(self, image_input):
            return self.embcache_hook.encode_items(
                image_input.raw_items, image_input.pixel_values, self.visual, request_ids)

and call hook.finish_request(request_id) when the request finishes (the
RFC's cleanup_request). With enable_embedding_cache: false the hook calls
the encoder as before and never contacts the agent.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from embcache import EmbeddingCache, EncoderPreprocessingConfig, Tensor


class EmbcacheEncoderHook:
    def __init__(self, stage_config: dict, preprocessing: EncoderPreprocessingConfig, device: Optional[str] = None):
        self.cache = EmbeddingCache.from_stage_config(stage_config)
        self.preprocessing = preprocessing
        self.device = device

    def encode_items(self, raw_items: Sequence[bytes], inputs: Sequence, encoder: Callable, request_ids: Sequence[str]):
        """One embedding per item: raw_items[i] is the item's bytes as the
        request carried them (the JPEG, the WAV), inputs[i] the preprocessed
        tensor the encoder takes, request_ids[i] the request it belongs to."""
        out = []
        for raw, x, req in zip(raw_items, inputs, request_ids):
            key = self.cache.key_from_raw_bytes(self.preprocessing, raw) if self.cache.enabled else None
            emb = self.cache.get_or_compute(key, lambda x=x: _to_cpu(encoder(x)), req)
            out.append(self._tensor(emb))
        return out

    def _tensor(self, emb):
        if hasattr(emb, "torch"):  # an Embedding: a view of the shm mapping
            t = emb.torch()
            return t.to(self.device) if self.device else t
        return emb  # the cache is off: the encoder's own output

    def finish_request(self, request_id: str) -> None:
        self.cache.cleanup_request(request_id)


def _to_cpu(t):
    """What the cache stores: a contiguous CPU tensor (or a Tensor)."""
    if hasattr(t, "detach"):
        return t.detach().contiguous().cpu()
    return t


if __name__ == "__main__":
    # A runnable sketch with a stand-in encoder and the cache off.
    cfg = EncoderPreprocessingConfig(model_id="Qwen/Qwen2.5-Omni-7B", model_revision="main",
                                     encoder_config_hash="b3:vit", processor_version="transformers-4.57.1",
                                     modality="image", tenant="default", resize_mode="bicubic",
                                     image_size=(448, 448), crop_mode="center",
                                     normalize_mean=(0.48145466, 0.4578275, 0.40821073),
                                     normalize_std=(0.26862954, 0.26130258, 0.27577711), input_dtype="bfloat16")
    hook = EmbcacheEncoderHook({"embedding_cache": {"enable_embedding_cache": False}}, cfg)
    encoder = lambda x: Tensor(bytes(16), "float32", (4,))
    print(hook.encode_items([b"jpeg"], [None], encoder, ["req-1"]))
