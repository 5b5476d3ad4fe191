"""The key the Python side names is the key Go computes."""

import dataclasses
import json
import unittest

from embcache import APIError, EmbeddingCache, EmbeddingCacheKey, EncoderPreprocessingConfig, Tensor

from . import harness

torch = harness.optional("torch")


class KeyParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = harness.Cluster()
        cls.cache = EmbeddingCache(cls.cluster.agent("n1"))

    @classmethod
    def tearDownClass(cls):
        cls.cache.close()
        cls.cluster.close()

    def test_vectors(self):
        with open(harness.VECTORS) as f:
            vectors = json.load(f)["vectors"]
        self.assertGreater(len(vectors), 10)
        for v in vectors:
            with self.subTest(v["name"]):
                cfg = EncoderPreprocessingConfig.from_dict(v["config"])
                data = bytes.fromhex(v.get("input_hex", ""))
                if v["mode"] == "raw-bytes":
                    k = EmbeddingCacheKey.from_raw_bytes(data, cfg, cache=self.cache)
                elif v["mode"] == "decoded-tensor":
                    k = EmbeddingCacheKey.from_decoded_tensor(Tensor(data, v["dtype"], v["shape"]), cfg, cache=self.cache)
                else:
                    k = self.cache.key_from_tokens(cfg, v["tokens"], v["block_size"])
                    self.assertEqual(list(k.prefix_keys), v.get("prefix_keys") or [])
                self.assertEqual(k.key, v["key"])
                self.assertEqual(k.tenant, v["config"]["tenant"])

    def test_config_has_every_field(self):
        # The agent refuses a config without one of its fields, so the
        # vectors above pass only if the dataclass carries them all; this
        # names the fields when one is added on either side.
        with open(harness.VECTORS) as f:
            go_fields = set(json.load(f)["vectors"][0]["config"])
        self.assertEqual({f.name for f in dataclasses.fields(EncoderPreprocessingConfig)}, go_fields)

    def test_every_field_changes_the_key(self):
        image = harness.config()
        video = dataclasses.replace(image, modality="video", video_frame_stride=2)
        audio = harness.config(modality="audio", resize_mode="", image_size=(0, 0), crop_mode="", normalize_mean=(),
                               normalize_std=(), audio_sample_rate=16000, audio_codec_version="c1",
                               audio_codec_config_hash="h1", input_dtype="float32")
        changes = [(image, dict(model_id="other")), (image, dict(model_revision="r2")),
                   (image, dict(encoder_config_hash="b3:x")), (image, dict(processor_version="p2")),
                   (image, dict(modality="video", video_frame_stride=1)), (image, dict(tenant="beta")),
                   (image, dict(cache_schema_version=2)), (image, dict(resize_mode="bilinear")),
                   (image, dict(image_size=(224, 224))), (image, dict(crop_mode="none")),
                   (image, dict(normalize_mean=(0.4, 0.5, 0.5))), (image, dict(normalize_std=(0.5, 0.5, 0.6))),
                   (audio, dict(audio_sample_rate=24000)), (audio, dict(audio_codec_version="c2")),
                   (audio, dict(audio_codec_config_hash="h2")), (video, dict(video_frame_stride=3)),
                   (image, dict(input_dtype="float32")), (image, dict(weight_epoch=1))]
        changed = set()
        for base, change in changes:
            with self.subTest(change):
                k0 = self.cache.key_from_raw_bytes(base, b"jpeg")
                k = self.cache.key_from_raw_bytes(dataclasses.replace(base, **change), b"jpeg")
                self.assertNotEqual(k.key, k0.key)
                changed |= set(change)
        self.assertEqual(changed, {f.name for f in dataclasses.fields(EncoderPreprocessingConfig)})

    def test_a_scalar_is_not_a_list_of_one(self):
        # numpy's ascontiguousarray makes a 0-d array 1-d: the two took one
        # key, and the value came back as [x] (a helper's hunt found it).
        import numpy as np
        cfg = harness.config()
        scalar = self.cache.key_from_decoded_tensor(cfg, np.array(3.0, np.float32))
        one = self.cache.key_from_decoded_tensor(cfg, np.array([3.0], np.float32))
        same = self.cache.key_from_decoded_tensor(cfg, np.float32(3.0).tobytes(), dtype="float32", shape=())
        self.assertNotEqual(scalar.key, one.key)
        self.assertEqual(scalar.key, same.key)

    def test_a_value_is_keyed_as_what_it_holds_or_refused(self):
        # Each was keyed as another input's key (a helper's hunt found them):
        # token ids 1.9 and True cut to 1; a Tensor of a big-endian array
        # keyed by its bytes as they lie; an int32 array keyed as float32.
        import numpy as np
        from embcache import InvalidValue
        cfg = harness.config(modality="tokens", resize_mode="", image_size=(0, 0), crop_mode="", normalize_mean=(),
                             normalize_std=(), input_dtype="int32", audio_codec_version="c1",
                             audio_codec_config_hash="h1")
        for tokens in ([1.9, 2, 3], [True, 2, 3], np.array([1.5, 2.0, 3.0])):
            with self.assertRaises(InvalidValue, msg=repr(tokens)):
                self.cache.key_from_tokens(cfg, tokens)
        self.assertEqual(self.cache.key_from_tokens(cfg, np.array([1, 2, 3], np.int64)).key,
                         self.cache.key_from_tokens(cfg, [1, 2, 3]).key)
        # A numpy block size raised TypeError from json; 16.0 and True were sent.
        self.assertEqual(self.cache.key_from_tokens(cfg, [1, 2, 3], np.int64(16)).key,
                         self.cache.key_from_tokens(cfg, [1, 2, 3], 16).key)
        for size in (16.0, True, -1):
            with self.assertRaises(InvalidValue, msg=repr(size)):
                self.cache.key_from_tokens(cfg, [1, 2, 3], size)
        cfg = harness.config()
        little = np.arange(6, dtype="<f4").reshape(2, 3)
        big = little.astype(">f4")
        self.assertEqual(self.cache.key_from_decoded_tensor(cfg, Tensor(big, "float32", (2, 3))).key,
                         self.cache.key_from_decoded_tensor(cfg, little).key)
        with self.assertRaises(InvalidValue):
            self.cache.key_from_decoded_tensor(cfg, Tensor(memoryview(big), "float32", (2, 3)))
        for arr, dtype, shape in ((np.int32([1, 2, 3]), "float32", None), (np.arange(6, dtype=np.float32), None, (4,))):
            with self.assertRaises(InvalidValue, msg=f"{arr.dtype} as {dtype} {shape}"):
                self.cache.key_from_decoded_tensor(cfg, arr, dtype=dtype, shape=shape)
        # A dimension 2.9 was cut to 2: six bytes-worth of floats keyed as (2, 3).
        six = np.arange(6, dtype=np.float32)
        for value, shape in ((six.tobytes(), (2.9, 3)), (six, (2.0, 3)), (six, (True, 6)), (six.tobytes(), (-2, -3))):
            with self.assertRaises(InvalidValue, msg=f"shape {shape}"):
                self.cache.key_from_decoded_tensor(cfg, value, dtype="float32", shape=shape)
        with self.assertRaises(InvalidValue):
            self.cache.key_from_decoded_tensor(cfg, Tensor(six.tobytes(), "float32", (2.9, 3)))
        self.assertEqual(self.cache.key_from_decoded_tensor(cfg, six, shape=np.array([2, 3])).key,
                         self.cache.key_from_decoded_tensor(cfg, six.reshape(2, 3)).key)
        bf16 = self.cache.key_from_decoded_tensor(cfg, np.uint16([16256]), dtype="bfloat16")
        self.assertEqual(bf16.key, self.cache.key_from_decoded_tensor(cfg, np.uint16([16256]).tobytes(),
                                                                        dtype="bfloat16", shape=(1,)).key)

    def test_a_dtype_or_shape_given_with_a_value_is_honoured_or_refused(self):
        # A torch tensor or a Tensor dropped dtype= and shape= silently: each
        # took its own dtype's or shape's key where a numpy array of the same
        # bytes took the one asked for, or was refused (a helper's hunt).
        import array

        import numpy as np
        from embcache import InvalidValue
        cfg = harness.config()
        six = np.arange(6, dtype=np.float32)
        want = self.cache.key_from_decoded_tensor(cfg, six.reshape(2, 3)).key
        values = [six, Tensor(six.tobytes(), "float32", (6,)), Tensor(six, "float32", (6,))]
        if torch is not None:
            values.append(torch.from_numpy(six))
        for v in values:
            with self.subTest(type(v).__name__):
                self.assertEqual(self.cache.key_from_decoded_tensor(cfg, v, shape=(2, 3)).key, want)
                for dtype, shape in (("int32", None), (None, (2, 2)), ("bfloat16", None)):
                    with self.assertRaises(InvalidValue, msg=f"{dtype} {shape}"):
                        self.cache.key_from_decoded_tensor(cfg, v, dtype=dtype, shape=shape)
        if torch is not None:
            bits = np.arange(6, dtype=np.int16).reshape(2, 3)
            self.assertEqual(self.cache.key_from_decoded_tensor(cfg, bits, dtype="bfloat16").key,
                             self.cache.key_from_decoded_tensor(cfg, torch.from_numpy(bits).view(torch.bfloat16)).key)
            # bfloat16 bits in 16-bit integers, as a numpy array may hold them.
            self.assertEqual(self.cache.key_from_decoded_tensor(cfg, torch.from_numpy(bits), dtype="bfloat16").key,
                             self.cache.key_from_decoded_tensor(cfg, bits, dtype="bfloat16").key)
            self.assertEqual(self.cache.key_from_decoded_tensor(cfg, Tensor(bits.tobytes(), "int16", (2, 3)),
                                                                dtype="bfloat16").key,
                             self.cache.key_from_decoded_tensor(cfg, bits, dtype="bfloat16").key)
            with self.assertRaises(InvalidValue):
                self.cache.key_from_decoded_tensor(cfg, torch.from_numpy(bits.astype(np.int32)), dtype="bfloat16")
        # Typed buffers are what their format says: float64 bytes are not
        # float32 data; untyped bytes may be any dtype.
        doubles = np.array([1.0, 2.0])
        for data in (memoryview(doubles), array.array("d", [1.0, 2.0]), memoryview(six)[::2]):
            with self.assertRaises(InvalidValue, msg=repr(data)):
                self.cache.key_from_decoded_tensor(cfg, Tensor(data, "float32", (4,)))
            with self.assertRaises(InvalidValue, msg=repr(data)):
                self.cache.key_from_decoded_tensor(cfg, data, dtype="float32", shape=(4,))
        self.assertEqual(self.cache.key_from_decoded_tensor(cfg, Tensor(array.array("f", six.tolist()), "float32", (2, 3))).key,
                         want)
        self.assertEqual(self.cache.key_from_decoded_tensor(cfg, memoryview(doubles.tobytes()), dtype="float32",
                                                            shape=(4,)).key,
                         self.cache.key_from_decoded_tensor(cfg, doubles.view(np.float32)).key)

    def test_a_string_that_is_not_text_is_refused(self):
        # Python writes an undecodable file name's byte as a lone surrogate;
        # decoded leniently, two model paths took one key.
        import os
        for name in (os.fsdecode(b"/models/caf\xe9"), os.fsdecode(b"/models/caf\xe8")):
            with self.subTest(model_id=name):
                with self.assertRaises(APIError) as e:
                    self.cache.key_from_raw_bytes(dataclasses.replace(harness.config(), model_id=name), b"x")
                self.assertEqual(e.exception.status, 400)
                self.assertIn("model_id", str(e.exception))

    def test_bad_config_is_refused(self):
        with self.assertRaises(APIError) as e:
            self.cache.key_from_raw_bytes(harness.config(tenant="a.b"), b"x")
        self.assertEqual(e.exception.status, 400)
        with self.assertRaises(ValueError):
            EncoderPreprocessingConfig.from_dict(dict(harness.config().to_wire(), crop="center"))
        # As strict as the agent's decoder: a field left out is refused,
        # never defaulted (weight_epoch would be keyed as 0).
        wire = harness.config().to_wire()
        del wire["weight_epoch"]
        with self.assertRaisesRegex(ValueError, "weight_epoch"):
            EncoderPreprocessingConfig.from_dict(wire)
        with self.assertRaisesRegex(ValueError, "MODEL_ID"):
            EncoderPreprocessingConfig.from_dict(dict(harness.config().to_wire(), MODEL_ID="m"))
        with self.assertRaises(ValueError):
            EncoderPreprocessingConfig.from_dict(dict(harness.config().to_wire(), image_size=[448, 448, 3]))
        with self.assertRaises(ValueError):
            EmbeddingCacheKey(key="xyz", tenant="acme")

    def test_wrong_types_are_refused_by_name(self):
        # Each field's type is checked where the config is made, naming the
        # field: a YAML "3" for an epoch never reaches the agent.
        good = harness.config().to_wire()
        for name, bad in [("weight_epoch", "3"), ("weight_epoch", True), ("audio_sample_rate", 16000.0),
                          ("model_id", 7), ("tenant", None), ("image_size", "448x448"), ("image_size", [448.0, 448]),
                          ("normalize_mean", [0.5, "0.5", 0.5]), ("normalize_std", 0.5), ("cache_schema_version", "1")]:
            with self.subTest(field=name, value=bad):
                with self.assertRaisesRegex(TypeError, f"preprocessing config: {name}: "):
                    EncoderPreprocessingConfig.from_dict(dict(good, **{name: bad}))
        # None stands for an empty normalize list, as the agent reads it.
        cfg = EncoderPreprocessingConfig.from_dict(dict(good, modality="tokens", normalize_mean=None, normalize_std=None))
        self.assertEqual((cfg.normalize_mean, cfg.normalize_std), ((), ()))


if __name__ == "__main__":
    unittest.main()
