"""What a vLLM item's key commits to (embcache.vllm.keys): every input of
the preprocessing config changes it; audio without a sample rate, or an
image whose normalisation does not add up, is refused."""

import unittest

from embcache.vllm.keys import image_size_of, preprocessing_config

BASE = dict(model_id="Qwen/Qwen2.5-Omni-7B", revision="r1", hf_config={"model_type": "qwen2_5_omni"},
            processor={"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 12845056,
                       "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25], "sampling_rate": 16000,
                       "feature_extractor_type": "WhisperFeatureExtractor"},
            mm_processor_kwargs={}, dtype="torch.bfloat16", modality="image", tenant="acme", weight_epoch=0,
            versions={"vllm": "0.11.0", "transformers": "4.57.0"})


class KeysTest(unittest.TestCase):
    def test_every_input_changes_the_config(self):
        base = preprocessing_config(**BASE)
        self.assertEqual(base.input_dtype, "bfloat16")
        self.assertEqual(base.image_size, (12845056, 3136))
        changes = dict(model_id="Qwen/Other", revision="r2", hf_config={"model_type": "other"},
                       processor=dict(BASE["processor"], max_pixels=1003520), mm_processor_kwargs={"fps": 2},
                       dtype="float16", modality="video", tenant="beta", weight_epoch=1,
                       versions={"vllm": "0.12.0", "transformers": "4.57.0"})
        for name, value in changes.items():
            with self.subTest(name=name):
                self.assertNotEqual(preprocessing_config(**dict(BASE, **{name: value})).to_wire(), base.to_wire())
        self.assertEqual(preprocessing_config(**dict(BASE, revision=None)).model_revision, "unpinned")
        self.assertEqual(preprocessing_config(**BASE).to_wire(), base.to_wire(), "the same inputs, the same config")

    def test_audio_needs_a_sample_rate(self):
        cfg = preprocessing_config(**dict(BASE, modality="audio"))
        self.assertEqual((cfg.audio_sample_rate, cfg.audio_codec_version), (16000, "WhisperFeatureExtractor"))
        with self.assertRaisesRegex(ValueError, "sampling_rate"):
            preprocessing_config(**dict(BASE, modality="audio", processor={"feature_extractor_type": "x"}))

    def test_bad_inputs_are_refused(self):
        with self.assertRaisesRegex(ValueError, "modality"):
            preprocessing_config(**dict(BASE, modality="text"))
        with self.assertRaisesRegex(ValueError, "image_std"):
            preprocessing_config(**dict(BASE, processor=dict(BASE["processor"], image_std=[0.5, 0.5])))
        for missing in ("image_mean", "image_std"):  # an empty processor config keys nothing
            proc = {k: v for k, v in BASE["processor"].items() if k != missing}
            with self.assertRaisesRegex(ValueError, "image_mean and image_std"):
                preprocessing_config(**dict(BASE, processor=proc))
        with self.assertRaisesRegex(ValueError, "image_mean and image_std"):
            preprocessing_config(**dict(BASE, processor={}))

    def test_image_sizes(self):
        for proc, want in (({"size": {"width": 448, "height": 336}}, ((448, 336), "fixed")),
                           ({"size": 224}, ((224, 224), "fixed")),
                           ({"size": {"shortest_edge": 3136, "longest_edge": 12845056}}, ((12845056, 3136), "edges")),
                           ({"size": {"shortest_edge": 224}}, ((224, 224), "shortest-edge")),
                           ({"min_pixels": 1, "max_pixels": 9}, ((9, 1), "pixels")),
                           ({}, ((1, 1), "dynamic")), ({"size": True}, ((1, 1), "dynamic"))):
            with self.subTest(proc=proc):
                self.assertEqual(image_size_of(proc), want)


if __name__ == "__main__":
    unittest.main()
