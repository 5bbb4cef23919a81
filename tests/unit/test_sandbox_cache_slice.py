"""The sandbox host's package cache, sliced to the engines it may install (deployer/sandbox/image.py): the unpacked
wheels a prepared venv was hard-linked from, found by inode, and nothing else of archive-v0."""
import os

import pytest

from deployer.sandbox import image


def _wheel(cache, wid, dist, files=("pkg/__init__.py",)):
    d = cache / "archive-v0" / wid
    (d / f"{dist}.dist-info").mkdir(parents=True)
    (d / f"{dist}.dist-info" / "METADATA").write_text(f"Name: {dist}\n")
    for f in files:
        (d / f).parent.mkdir(parents=True, exist_ok=True)
        (d / f).write_text("x = 1\n")
    return d


def _venv(root, name, wheels):
    v = root / name
    site = v / "lib/python3.11/site-packages"
    site.mkdir(parents=True)
    for w in wheels:
        for meta in w.glob("*.dist-info/METADATA"):
            (site / meta.parent.name).mkdir()
            os.link(meta, site / meta.parent.name / "METADATA")     # as uv installs: hard links of the cache's files
    (v / ".deployer-installed").write_text("1\n")
    return v


@pytest.fixture
def cache(tmp_path, monkeypatch):
    c = tmp_path / "uv"
    torch = _wheel(c, "T1", "torch-2.9.1")
    torch_other = _wheel(c, "T2", "torch-2.9.1")         # the same name and version, another build: not linked
    vllm16, vllm18 = _wheel(c, "V16", "vllm-0.16.0"), _wheel(c, "V18", "vllm-0.18.0")
    (c / "simple-v28" / "pypi").mkdir(parents=True)
    (c / "simple-v28" / "pypi" / "torch.rkyv").write_text("index")
    (c / "CACHEDIR.TAG").write_text("Signature")
    venvs = tmp_path / "xdg" / "deployer" / "venvs"
    _venv(venvs, "vllm-0.16.0", [torch, vllm16])
    _venv(venvs, "vllm-0.18.0", [torch, vllm18])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(image, "uv_cache_dir", lambda: c)
    return {"dir": c, "torch": torch, "torch_other": torch_other, "vllm16": vllm16, "vllm18": vllm18}


def test_a_slice_holds_the_wheels_of_the_named_venvs_only(cache):
    assert image.cache_slice(cache["dir"], ("vllm-0.16.0",)) == sorted([cache["torch"], cache["vllm16"]])
    assert image.cache_slice(cache["dir"], ("vllm-0.16.0", "vllm-0.18.0")) == sorted(
        [cache["torch"], cache["vllm16"], cache["vllm18"]])


def test_a_venv_that_was_not_prepared_is_named(cache):
    with pytest.raises(KeyError, match="sglang-0.5.23: no prepared venv"):
        image.cache_slice(cache["dir"], ("sglang-0.5.23",))


def test_the_linked_slice_keeps_the_indexes_and_links_not_copies(cache, tmp_path):
    dst = tmp_path / "host" / "cache" / "uv"
    image.link_package_cache(dst, ("vllm-0.16.0",))
    assert sorted(p.name for p in (dst / "archive-v0").iterdir()) == ["T1", "V16"]
    assert (dst / "simple-v28" / "pypi" / "torch.rkyv").read_text() == "index"
    assert (dst / "CACHEDIR.TAG").is_file()
    got, src = dst / "archive-v0" / "T1" / "pkg" / "__init__.py", cache["torch"] / "pkg" / "__init__.py"
    assert got.stat().st_ino == src.stat().st_ino


def test_all_of_it_when_no_venvs_are_named(cache, tmp_path):
    dst = tmp_path / "host" / "cache" / "uv"
    image.link_package_cache(dst, None)
    assert sorted(p.name for p in (dst / "archive-v0").iterdir()) == ["T1", "T2", "V16", "V18"]
