"""The preflight's shard check (deployer/host/module_utils/safetensors_header.py): a truncated or foreign
shard is found from its own header, before a load that would fail on it after minutes (issue #12)."""
from deployer.host.module_utils.safetensors_header import check_shard
from deployer.sandbox.checkpoints import safetensors_bytes


def test_a_whole_shard_passes_and_a_truncated_one_is_measured_against_its_header(tmp_path):
    good = safetensors_bytes({"a": ("BF16", [4, 4], b"\1" * 32), "b": ("F32", [2], b"\2" * 8)})
    p = tmp_path / "s.safetensors"
    p.write_bytes(good)
    assert check_shard(p) == (len(good), None, 40)
    p.write_bytes(good[:-5])                    # a partial download
    assert check_shard(p) == (len(good), "truncated", 0)
    p.write_bytes(good + b"x")
    assert check_shard(p)[1] == "longer than its header declares"


def test_empty_foreign_and_lying_files_are_named(tmp_path):
    p = tmp_path / "s.safetensors"
    p.write_bytes(b"")                          # truncated to 0 bytes
    assert check_shard(p) == (None, "shorter than a safetensors header (8 bytes)", 0)
    p.write_bytes(b"\0" * 16)                   # zeros: a 0-byte header is not JSON
    assert check_shard(p)[1] == "header is not JSON (not a safetensors file)"
    p.write_bytes((10 ** 6).to_bytes(8, "little") + b"{}")
    assert "beyond the file's end" in check_shard(p)[1]
    p.write_bytes(b"<html>Rate limit exceeded</html>")   # what a failed download leaves
    assert check_shard(p)[0] is None and check_shard(p)[1]
    assert check_shard(tmp_path / "gone.safetensors")[1].startswith("unreadable")
