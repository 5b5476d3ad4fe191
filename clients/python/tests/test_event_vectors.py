"""The event golden vectors (events/testdata/events), read and written by a
reader built from docs/protocol.md section 4 alone, with Debian's
python3-msgpack: what an outsider's implementation does."""

import glob
import json
import os
import unittest

from tests.harness import ROOT, optional

msgpack = optional("msgpack")

VECTORS = os.path.join(ROOT, "events", "testdata", "events")
KINDS = {1: "published", 2: "touched", 3: "evicted", 4: "abandoned", 5: "invalidated"}

# Section 4.1: each key of the body, its msgpack type, in the order a writer
# puts them; the optional ones are left out when absent.
FIELDS = [
    ("v", int, True),
    ("kind", int, True),
    ("tenant", str, True),
    ("key", bytes, True),
    ("model", str, False),
    ("epoch", int, False),
    ("node", str, False),
    ("time", int, True),
    ("expires", int, False),
    ("location", dict, False),
    ("cause", int, False),
    ("reason", str, False),
]
LOCATION = [
    ("transport", str, True),
    ("node", str, True),
    ("address", str, False),
    ("object", str, True),
    ("size", int, True),
    ("checksum", bytes, True),
]


def check(body: dict, fields: list) -> dict:
    """The body in the vectors' JSON form (bin as hex), its types checked."""
    unknown = set(body) - {name for name, _, _ in fields}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    out = {}
    for name, kind, required in fields:
        if name not in body:
            if required:
                raise ValueError(f"{name} missing")
            continue
        value = body[name]
        if type(value) is not kind:
            raise ValueError(f"{name} is {type(value).__name__}, want {kind.__name__}")
        if kind is bytes:
            if len(value) != 32:
                raise ValueError(f"{name} has {len(value)} bytes, want 32")
            value = value.hex()
        elif kind is dict:
            value = check(value, LOCATION)
        out[name] = value
    return out


def decode(body: bytes) -> dict:
    event = check(msgpack.unpackb(body, raw=False), FIELDS)
    if event["v"] != 2:
        raise ValueError(f"schema version {event['v']}")
    if event["kind"] not in KINDS:
        raise ValueError(f"kind {event['kind']}")
    return event


def encode(event: dict) -> bytes:
    """A writer's body: the JSON form's keys in section 4.1's order."""

    def ordered(fields: list, values: dict) -> dict:
        out = {}
        for name, kind, _ in fields:
            if name in values:
                v = values[name]
                out[name] = bytes.fromhex(v) if kind is bytes else ordered(LOCATION, v) if kind is dict else v
        return out

    return msgpack.packb(ordered(FIELDS, event), use_bin_type=True)


@unittest.skipIf(msgpack is None, "python3-msgpack is not installed (make test installs it)")
class EventVectors(unittest.TestCase):
    def vectors(self) -> list:
        files = sorted(glob.glob(os.path.join(VECTORS, "*.json")))
        self.assertGreaterEqual(len(files), 5)
        return files

    def test_read(self) -> None:
        for f in self.vectors():
            with self.subTest(vector=os.path.basename(f)):
                with open(f) as fh:
                    want = json.load(fh)
                with open(f[: -len(".json")] + ".msgpack", "rb") as fh:
                    got = decode(fh.read())
                self.assertEqual(got, want["event"])
                self.assertEqual(list(got), list(want["event"]), "key order")
                subject = f"embcache.ev.{got['tenant']}.{KINDS[got['kind']]}.{got['key']}"
                self.assertEqual(subject, want["subject"])

    def test_write_byte_for_byte(self) -> None:
        for f in self.vectors():
            with self.subTest(vector=os.path.basename(f)):
                with open(f) as fh:
                    event = json.load(fh)["event"]
                with open(f[: -len(".json")] + ".msgpack", "rb") as fh:
                    self.assertEqual(encode(event), fh.read())

    def test_refuses_wrong_types(self) -> None:
        with open(os.path.join(VECTORS, "published.msgpack"), "rb") as fh:
            body = msgpack.unpackb(fh.read(), raw=False)
        for name, bad in [
            ("key", body["key"].hex()),
            ("key", body["key"][:31]),
            ("time", str(body["time"])),
            ("kind", "1"),
        ]:
            with self.subTest(field=name):
                with self.assertRaisesRegex(ValueError, name):
                    decode(msgpack.packb({**body, name: bad}, use_bin_type=True))


if __name__ == "__main__":
    unittest.main()
