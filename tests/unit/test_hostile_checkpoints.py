"""A checkpoint or drafter whose safetensors header is hostile (deeply nested, the wrong JSON type, offsets that
are not integers) is refused with a message naming the file, never a crash (issue 40, F13)."""
import json
import struct

import pytest

from deployer.drafter_fit import DrafterFitError, safetensors_shapes
from deployer.host.module_utils.safetensors_header import check_shard


def shard(path, header_text, data=b""):
    raw = header_text.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


HOSTILE = {
    "nested": "[" * 100000 + "]" * 100000,
    "a list": "[1, 2]",
    "no offsets": json.dumps({"w": {"dtype": "F16", "shape": [1], "data_offsets": []}}),
    "a string offset": json.dumps({"w": {"dtype": "F16", "shape": [1], "data_offsets": [0, "8"]}}),
    "negative": json.dumps({"w": {"dtype": "F16", "shape": [1], "data_offsets": [0, -8]}}),
    "a string shape": json.dumps({"w": {"dtype": "F16", "shape": "4096", "data_offsets": [0, 2]}}),
    "nested shape": json.dumps({"w": {"dtype": "F16", "shape": [[1]], "data_offsets": [0, 2]}}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_header_is_refused_not_a_crash(tmp_path, case):
    p = shard(tmp_path / "model-00001-of-00001.safetensors", HOSTILE[case], b"\0\0")
    if case not in ("a string shape", "nested shape"):      # shapes are the drafter check's business
        expected, why, tensor_bytes = check_shard(str(p))
        assert why and tensor_bytes == 0, (case, why)
    with pytest.raises(DrafterFitError, match="model-00001-of-00001.safetensors"):
        safetensors_shapes(p)


def test_a_sound_header_still_passes(tmp_path):
    p = shard(tmp_path / "ok.safetensors", json.dumps({"__metadata__": {"format": "pt"},
                                                       "w": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}),
              b"\0\0")
    assert check_shard(str(p)) == (len(p.read_bytes()), None, 2)
    assert safetensors_shapes(p) == {"w": [1]}
