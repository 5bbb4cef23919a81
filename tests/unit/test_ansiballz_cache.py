"""The AnsiballZ cache callback (deployer/ansible_plugins/callback_plugins/deployer_ansiballz_cache.py): modules are
built once per code version, and a changed source is another directory, never a stale payload."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

PLUGIN = ROOT / "deployer/ansible_plugins/callback_plugins/deployer_ansiballz_cache.py"


def plugin():
    spec = importlib.util.spec_from_file_location("deployer_ansiballz_cache", PLUGIN)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_the_key_moves_with_any_source_file(tmp_path):
    m = plugin()
    (tmp_path / "mods").mkdir()
    f = tmp_path / "mods" / "x.py"
    f.write_text("a = 1\n")
    k1 = m.cache_key([str(tmp_path / "mods")])
    assert m.cache_key([str(tmp_path / "mods")]) == k1            # stable
    f.write_text("a = 22\n")                                       # an edit (size changes)
    k2 = m.cache_key([str(tmp_path / "mods")])
    os.utime(f, ns=(1, 1))                                         # same size, another mtime
    k3 = m.cache_key([str(tmp_path / "mods")])
    (tmp_path / "mods" / "y.py").write_text("")                    # a new file
    k4 = m.cache_key([str(tmp_path / "mods")])
    assert len({k1, k2, k3, k4}) == 4
    (tmp_path / "mods" / "__pycache__").mkdir()                    # bytecode is not a source
    (tmp_path / "mods" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert m.cache_key([str(tmp_path / "mods")]) == k4


def _play(tmp_path, cache_root):
    (tmp_path / "p.yml").write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                                    "    - ansible.builtin.command: 'true'\n      changed_when: false\n")
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "DEPLOYER_ANSIBALLZ_CACHE": str(cache_root), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")}
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "p.yml")],
                          capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)


def test_a_second_run_uses_the_payload_the_first_built(tmp_path):
    root = tmp_path / "cache"
    r = _play(tmp_path, root)
    assert r.returncode == 0, r.stdout + r.stderr
    [keyed] = list(root.iterdir())
    payload = keyed / "ansible.modules.command-ZIP_DEFLATED-none"
    assert payload.is_file(), sorted(p.name for p in keyed.iterdir())
    assert oct(root.stat().st_mode & 0o777) == "0o700" and oct(keyed.stat().st_mode & 0o777) == "0o700"
    os.utime(payload, ns=(1, 1))
    r = _play(tmp_path, root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert payload.stat().st_mtime_ns == 1          # read, not rebuilt
    assert not list((tmp_path / "tmp").iterdir())   # the run's own temporary directory went, the cache stays


def test_a_cache_root_others_may_write_is_not_used(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    r = _play(tmp_path, root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "is not a directory only this user may use (mode 0700)" in " ".join((r.stdout + r.stderr).split())
    assert not list(root.iterdir())


def test_cached_payloads_carry_bytecode_a_host_uses_only_when_it_matches_the_source(tmp_path):
    """Each cached payload has a hash-checked .pyc beside each .py (hosts import from the zip, where Python cannot
    write bytecode, so every module run compiled ansible.module_utils.basic again); a .pyc whose source hash does
    not match its .py is ignored by the importer, so a mismatch can never run other code than the source."""
    import base64
    import io
    import pickle
    import zipfile
    root = tmp_path / "cache"
    r = _play(tmp_path, root)
    assert r.returncode == 0, r.stdout + r.stderr
    [keyed] = list(root.iterdir())
    with open(keyed / "ansible.modules.command-ZIP_DEFLATED-none", "rb") as f:
        cached = pickle.load(f)
    z = zipfile.ZipFile(io.BytesIO(base64.b64decode(cached.zip_data)))
    py = [n for n in z.namelist() if n.endswith(".py")]
    assert "ansible/module_utils/basic.py" in py
    assert sorted(n for n in z.namelist() if n.endswith(".pyc")) == sorted(n + "c" for n in py)
    pyc = z.read("ansible/module_utils/basic.pyc")
    assert int.from_bytes(pyc[4:8], "little") == 0b11      # hash-based, checked against its source
    assert pyc[8:16] == importlib.util.source_hash(z.read("ansible/module_utils/basic.py"))

    # the importer's side: a .pyc whose hash matches the source is what runs (so the bytecode is really used: here
    # its code is swapped to tell it apart), one recorded for another source is ignored and the source runs
    import marshal
    m = plugin()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as w:
        w.writestr("used.py", "VALUE = 'from-source'\n")
        w.writestr("stale.py", "VALUE = 'from-source'\n")
    built = zipfile.ZipFile(io.BytesIO(base64.b64decode(m.with_bytecode(base64.b64encode(buf.getvalue())))))
    other = m.with_bytecode(base64.b64encode(_zip({"stale.py": "VALUE = 'from-stale-bytecode'\n"})))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as w:
        for n in built.namelist():
            body = built.read(n)
            if n == "used.pyc":      # the header (its source hash) kept, the code swapped
                body = body[:16] + marshal.dumps(compile("VALUE = 'from-bytecode'\n", "used.py", "exec"))
            if n == "stale.pyc":     # bytecode of another source, with that source's hash
                body = zipfile.ZipFile(io.BytesIO(base64.b64decode(other))).read("stale.pyc")
            w.writestr(n, body)
    (tmp_path / "p.zip").write_bytes(out.getvalue())
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import used, stale; print(used.VALUE, stale.VALUE)"
    r = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "p.zip")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split() == ["from-bytecode", "from-source"], r


def _zip(files: dict) -> bytes:
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as w:
        for name, text in files.items():
            w.writestr(name, text)
    return buf.getvalue()
