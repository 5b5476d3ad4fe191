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

from embcache import AgentUnavailable, Embedding, EmbeddingCache, EncoderPreprocessingConfig, Tensor

try:  # a hit comes back as a torch tensor over the mapping, or a numpy array without torch
    import torch
except ImportError:
    torch = None
try:
    import numpy
except ImportError:
    numpy = None


class EmbcacheEncoderHook:
    def __init__(self, stage_config: dict, preprocessing: EncoderPreprocessingConfig, device: Optional[str] = None):
        self.cache = EmbeddingCache.from_stage_config(stage_config)
        self.preprocessing = preprocessing
        self.device = device

    def encode_items(self, raw_items: Sequence[bytes], inputs: Sequence, encoder: Callable, request_ids: Sequence[str]):
        """One embedding per item: raw_items[i] is the item's bytes as the
        request carried them (the JPEG, the WAV), inputs[i] the preprocessed
        tensor the encoder takes, request_ids[i] the request it belongs to.
        An item the cache has comes back as a read-only tensor over the
        shared mapping (a numpy array without torch); an item the encoder
        computed here (the cache's pick, the cache off, or the agent down in
        degrade mode) may come back as the encoder's own output. Either is
        moved to device when one is given."""
        if not (len(raw_items) == len(inputs) == len(request_ids)):
            raise ValueError(f"{len(raw_items)} raw items, {len(inputs)} inputs, {len(request_ids)} request ids")
        out = []
        for raw, x, req in zip(raw_items, inputs, request_ids):
            # The commit copies a device tensor to the CPU itself.
            emb = self.cache.get_or_compute(self._key(raw), lambda x=x: encoder(x), req)
            out.append(self._tensor(emb))
        return out

    def _key(self, raw: bytes):
        """The item's key; None (compute locally) when the cache is off, or
        when the agent cannot be reached in degrade mode."""
        if not self.cache.enabled:
            return None
        try:
            return self.cache.key_from_raw_bytes(self.preprocessing, raw)
        except AgentUnavailable:
            if self.cache.strict:
                raise
            return None

    def _tensor(self, emb):
        if not isinstance(emb, Embedding):
            # The encoder's own output (computed here, or without the
            # cache): already where the encoder put it, unless device says otherwise.
            return emb.to(self.device) if self.device and hasattr(emb, "to") else emb
        if torch is not None:
            t = emb.torch()  # a view of the shm mapping: no copy until .to(device)
            return t.to(self.device) if self.device else t
        if numpy is not None:
            return emb.numpy()  # read-only; bfloat16 comes back as uint16
        return emb  # neither: the Embedding itself (.tobytes(), .dtype, .shape)

    def finish_request(self, request_id: str) -> int:
        """Ends the request (the RFC's cleanup_request): unpins what it
        looked up. Returns how many values were unpinned."""
        return self.cache.cleanup_request(request_id)


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
