"""scripts/precompile_uv_cache.py: bytecode beside the cached wheels' sources, never in a wheel's .data tree (uv
refuses a __pycache__ among a wheel's scripts), current for the interpreter that will import it, and skipped
when the archive has nothing new."""
import importlib.util
import subprocess
import sys

from helpers import ROOT

SCRIPT = ROOT / "scripts" / "precompile_uv_cache.py"


def _archive(tmp_path):
    entry = tmp_path / "uv" / "archive-v0" / "Abc123"
    (entry / "pkg").mkdir(parents=True)
    (entry / "pkg" / "__init__.py").write_text("")
    (entry / "pkg" / "mod.py").write_text("VALUE = 42\n")
    (entry / "tool-1.0.data" / "scripts").mkdir(parents=True)
    (entry / "tool-1.0.data" / "scripts" / "tool.py").write_text("print('hi')\n")
    return entry


def test_bytecode_beside_the_sources_but_not_in_a_wheels_data_tree(tmp_path):
    entry = _archive(tmp_path)
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "uv"), str(tmp_path / "stamps")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    tag = sys.implementation.cache_tag
    assert (entry / "pkg" / "__pycache__" / f"mod.{tag}.pyc").is_file()
    assert not list((entry / "tool-1.0.data").rglob("__pycache__"))
    # what an install's compile step (compileall, force=False) does with it: nothing - it is current
    import compileall
    before = (entry / "pkg" / "__pycache__" / f"mod.{tag}.pyc").stat().st_ino
    assert compileall.compile_file(str(entry / "pkg" / "mod.py"), quiet=2, force=False)
    assert (entry / "pkg" / "__pycache__" / f"mod.{tag}.pyc").stat().st_ino == before
    # and the interpreter imports it from the bytecode (a source whose bytecode is current is not compiled)
    spec = importlib.util.spec_from_file_location("pkg.mod", entry / "pkg" / "mod.py")
    assert spec.cached and spec.cached.endswith(f"mod.{tag}.pyc")


def test_a_second_run_with_nothing_new_in_the_archive_walks_nothing(tmp_path):
    entry = _archive(tmp_path)
    args = [sys.executable, str(SCRIPT), str(tmp_path / "uv"), str(tmp_path / "stamps")]
    assert subprocess.run(args, timeout=120).returncode == 0
    [stamp] = list((tmp_path / "stamps").glob("uv-bytecode-*"))
    (entry / "pkg" / "new.py").write_text("X = 1\n")          # same archive entries: the stamp says done
    assert subprocess.run(args, timeout=120).returncode == 0
    assert not (entry / "pkg" / "__pycache__" / f"new.{sys.implementation.cache_tag}.pyc").exists()
    (tmp_path / "uv" / "archive-v0" / "Def456").mkdir()        # a new wheel in the cache: compiled again
    assert subprocess.run(args, timeout=120).returncode == 0
    assert (entry / "pkg" / "__pycache__" / f"new.{sys.implementation.cache_tag}.pyc").exists()
    assert [p.name for p in (tmp_path / "stamps").glob("uv-bytecode-*")] != [stamp.name]
