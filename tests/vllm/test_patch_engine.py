"""The patch engine on the real files of real vLLM wheels."""
import ast
import hashlib

import pytest

from deployer.host.module_utils import eagle3_patch as pe
from helpers import ROOT

pytestmark = pytest.mark.vllm
PATCHED = ["0.16.0", "0.17.1"]
NATIVE = ["0.18.0", "0.33.0", "0.34.0"]


def tree_hashes(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*.py")) if ".deployer_patch" not in p.parts}


def cls(tree, name):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def meth(c, name):
    return next((n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def bases(c):
    return [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in c.bases]


def assert_p1_to_p5(root):
    ds = ast.parse((root / pe.F_DSV2).read_text())
    model = cls(ds, "DeepseekV2Model")
    init_src = ast.unparse(meth(model, "__init__"))
    fwd = meth(model, "forward")
    fwd_src = ast.unparse(fwd)
    assert "self.aux_hidden_state_layers = tuple[int, ...]()" in init_src                      # P1
    assert "enumerate(islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer)" in fwd_src
    assert "aux_hidden_states.append(hidden_states + residual)" in fwd_src
    assert ast.unparse(fwd.body[-2]) == "if len(aux_hidden_states) > 0:\n    return (hidden_states, aux_hidden_states)"
    causal = cls(ds, "DeepseekV2ForCausalLM")
    assert "SupportsEagle3" in bases(causal)                                                    # P2
    assert "self.model.aux_hidden_state_layers = layers" in ast.unparse(meth(causal, "set_aux_hidden_state_layers"))
    assert "(2, num_layers // 2, num_layers - 3)" in ast.unparse(meth(causal, "get_eagle3_aux_hidden_state_layers"))
    k = ast.parse((root / pe.F_K25).read_text())
    kc = cls(k, "KimiK25ForConditionalGeneration")
    assert {"SupportsEagle", "SupportsEagle3"} <= set(bases(kc))                                # P3
    assert "self.language_model.set_aux_hidden_state_layers(layers)" in ast.unparse(
        meth(kc, "set_aux_hidden_state_layers"))
    assert "self.language_model.get_eagle3_aux_hidden_state_layers()" in ast.unparse(
        meth(kc, "get_eagle3_aux_hidden_state_layers"))
    spec = ast.parse((root / pe.F_SPEC).read_text())                                            # P4
    lists = [n.value for n in ast.walk(spec) if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
             and n.targets[0].id in pe.ALLOW_LIST_NAMES]
    assert lists and {"deepseek_v3", "kimi_k25"} <= {e.value for e in lists[0].elts}
    prop = (root / "v1/spec_decode/eagle.py").read_text()                                      # P5
    assert 'elif self.get_model_name(target_model) == "KimiK25ForConditionalGeneration":' in prop
    assert "target_model.config.media_placeholder_token_id" in prop
    for rel in (pe.F_DSV2, pe.F_K25, pe.F_SPEC, "v1/spec_decode/eagle.py"):
        compile((root / rel).read_bytes(), rel, "exec")


@pytest.mark.parametrize("version", PATCHED)
def test_patch_apply_idempotent_revert(vllm_src, version):
    root = vllm_src(version)
    pristine = tree_hashes(root)
    plan = pe.plan_from_sources(str(root))
    assert plan.needed == ["P1", "P2", "P3", "P4", "P5"]
    check = pe.apply(str(root), check_mode=True)
    assert check["changed"] and tree_hashes(root) == pristine          # check mode writes nothing
    assert "+class" not in check["diff"] and "+        aux_hidden_states = []" in check["diff"]
    modes = {rel: (root / rel).stat().st_mode & 0o7777 for rel in pe.plan_from_sources(str(root)).files}
    res = pe.apply(str(root))
    assert res["changed"] and res["patches"] == plan.needed and len(res["fingerprint"]) == 16
    assert res["fingerprint"] == check["fingerprint"]
    assert_p1_to_p5(root)
    # every swapped file keeps its mode: mkstemp's 0600 would hide it from the service user (mutant E1)
    assert modes and {rel: (root / rel).stat().st_mode & 0o7777 for rel in modes} == modes
    patched = tree_hashes(root)
    again = pe.apply(str(root))
    assert not again["changed"] and tree_hashes(root) == patched       # second apply: no byte changes
    assert pe.status(str(root))["state"] == "patched"
    rev = pe.revert(str(root))
    assert rev["changed"] and tree_hashes(root) == pristine            # byte-identical to the wheel
    assert {rel: (root / rel).stat().st_mode & 0o7777 for rel in modes} == modes
    assert not (root / pe.STATE_DIR).exists()
    assert pe.status(str(root))["state"] == "unpatched"


@pytest.mark.parametrize("version", NATIVE)
def test_native_versions_change_nothing(vllm_src, version):
    root = vllm_src(version)
    before = tree_hashes(root)
    res = pe.apply(str(root))
    assert not res["changed"] and res["patches"] == [] and "native support" in res["msg"]
    assert tree_hashes(root) == before and not (root / pe.STATE_DIR).exists()


def test_a_model_runner_v2_only_vllm_needs_no_p5_unless_its_speculator_reads_the_image_token(vllm_src):
    """vLLM 0.34 has no v1/spec_decode proposer (P5's site): Model Runner V2's EAGLE speculator takes a multimodal
    target's inputs as merged embeddings and never reads image_token_index, so there is nothing for P5 to do.  Found
    by detection: a speculator that did read it would be refused, not called native."""
    root = vllm_src("0.34.0")
    assert not any((root / rel).exists() for rel in pe.PROPOSER_FILES)
    plan = pe.plan_from_sources(str(root))
    assert plan.needed == [] and "P5" in plan.native
    spec = root / pe.MRV2_EAGLE
    spec.write_text(spec.read_text() + "\n_ = target_model.config.image_token_index\n")
    with pytest.raises(pe.PatchError, match="not recognised"):
        pe.plan_from_sources(str(root))


def test_0_15_1_refused(vllm_src):
    root = vllm_src("0.15.1")
    with pytest.raises(pe.PatchError) as e:
        pe.apply(str(root))
    assert "0.15.1" in str(e.value) and "bare DeepseekV2Model" in str(e.value) and ">= 0.16.0" in str(e.value)


def test_drift_detected_between_apply_and_revert(vllm_src):
    root = vllm_src("0.16.0")
    pe.apply(str(root))
    f = root / pe.F_K25
    f.write_text(f.read_text() + "\n# edited by hand\n")
    with pytest.raises(pe.DriftError) as e:
        pe.revert(str(root))
    assert "model_executor/models/kimi_k25.py" in str(e.value)
    with pytest.raises(pe.DriftError):
        pe.apply(str(root))
    assert "# edited by hand" in f.read_text()                         # refused: nothing touched


def test_a_damaged_backup_is_refused_by_revert_and_nothing_is_written(vllm_src):
    """Revert restores the pristine files from .deployer_patch/orig; a backup that no longer hashes to the pristine
    file would install something no wheel ever held (mutant E2)."""
    root = vllm_src("0.16.0")
    pe.apply(str(root))
    patched = tree_hashes(root)
    backup = root / pe.STATE_DIR / "orig" / pe.F_K25
    backup.write_text(backup.read_text() + "\nimport os; os.system('id')\n")
    with pytest.raises(pe.DriftError, match="backup of model_executor/models/kimi_k25.py"):
        pe.revert(str(root))
    assert tree_hashes(root) == patched and pe.status(str(root))["state"] == "patched"


def test_interrupted_apply_is_finished(vllm_src, monkeypatch):
    root = vllm_src("0.16.0")
    real = pe._atomic_write

    def flaky(path, data, mode=None):
        if str(path).endswith("kimi_k25.py") and ".deployer_patch" not in str(path):
            raise OSError("disk full")
        return real(path, data, mode)
    monkeypatch.setattr(pe, "_atomic_write", flaky)
    pristine = tree_hashes(root)
    with pytest.raises(OSError):
        pe.apply(str(root))
    assert tree_hashes(root) == pristine and not (root / pe.STATE_DIR).exists()   # all or nothing
    monkeypatch.setattr(pe, "_atomic_write", real)
    assert pe.apply(str(root))["changed"]
    assert_p1_to_p5(root)


def test_apply_killed_mid_swap_is_finished_by_the_next_apply(vllm_src):
    """SIGKILL between two file swaps (no Python cleanup runs): the next apply finishes the job."""
    import subprocess
    import sys
    root = vllm_src("0.16.0")
    code = f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
from deployer.host.module_utils import eagle3_patch as pe
real, swapped = pe._atomic_write, []
def killer(path, data, mode=None):
    if ".deployer_patch" not in str(path):
        swapped.append(path)
        if len(swapped) == 2:
            os._exit(9)          # like SIGKILL: no except, no finally
    return real(path, data, mode)
pe._atomic_write = killer
pe.apply({str(root)!r})
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 9, r.stderr
    assert pe.status(str(root))["state"] == "partial"
    res = pe.apply(str(root))
    assert res["changed"] and res["msg"].startswith("finished an interrupted apply (")
    assert pe.status(str(root))["state"] == "patched"
    assert_p1_to_p5(root)
    assert not pe.apply(str(root))["changed"]


def test_cli_patch_diff_apply_revert(vllm_src):
    import json
    import subprocess
    import sys
    root = vllm_src("0.16.0")
    pristine = tree_hashes(root)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "deployer.cli", "patch", *args, "--vllm-root", str(root)],
                              capture_output=True, text=True)
    r = cli("diff")
    assert r.returncode == 0 and "+++ b/vllm/model_executor/models/kimi_k25.py" in r.stdout, r.stdout[-2000:]
    assert "SupportsEagle3" in r.stdout and tree_hashes(root) == pristine          # diff changes nothing
    r = cli("apply")
    assert r.returncode == 0 and "patched vLLM 0.16.0: P1, P2, P3, P4, P5" in r.stdout, r.stderr
    assert json.loads(cli("check", "--json").stdout)["state"] == "patched"
    r = cli("revert")
    assert r.returncode == 0, r.stderr
    assert tree_hashes(root) == pristine                                         # byte for byte


def test_cli_patch_check_json(vllm_src):
    import json
    import subprocess
    import sys
    root = vllm_src("0.17.1")
    r = subprocess.run([sys.executable, "-m", "deployer.cli", "patch", "check", "--vllm-root", str(root), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["state"] == "unpatched" and out["needed"] == ["P1", "P2", "P3", "P4", "P5"]
    assert out["vllm_version"] == "0.17.1"


@pytest.mark.parametrize("version", ["0.16.0", "0.18.0", "0.33.0", "0.34.0"])
def test_the_target_fields_the_drafter_check_requires_are_what_each_release_s_proposer_reads(vllm_src, version):
    """engines/vllm.py's PROPOSER_TARGET_FIELDS (a KimiK25 target's config must hold media_placeholder_token_id, or
    the drafter dies at load after the target's weights) against the release's own proposer: 0.16 once patched (P5
    adds the branch), 0.18 and 0.33 natively, 0.34 (Model Runner V2 only) none."""
    import re

    from deployer.engines.vllm import VLLM
    root = vllm_src(version)
    if version == "0.16.0":
        pe.apply(str(root))
    reads = set()
    for rel in pe.PROPOSER_FILES:
        if (root / rel).exists():
            src = (root / rel).read_text()
            for m in re.finditer(r'"KimiK25ForConditionalGeneration"', src):
                reads |= set(re.findall(r"target_model\.config\.(\w+)", src[m.end():m.end() + 400])[:1])
    want = set(VLLM().proposer_reads({"architectures": ["KimiK25ForConditionalGeneration"]}, version))
    assert reads == want, (version, reads, want)


@pytest.mark.parametrize("version", ["0.16.0", "0.18.0", "0.33.0", "0.34.0"])
def test_the_d2t_rule_of_the_drafter_check_is_what_each_release_s_drafter_loader_does(version):
    """engines/vllm.py's loads_d2t_at_full_vocab against the release's own llama_eagle3.py: from 0.30 it builds
    draft_id_to_target_id only for a draft vocabulary smaller than the target's (a shipped d2t then has nowhere to
    load)."""
    import zipfile

    from deployer.engines.vllm import VLLM
    from vllm_wheels import wheel
    src = zipfile.ZipFile(wheel(version)).read("vllm/model_executor/models/llama_eagle3.py").decode()
    conditional = "draft_vocab_size != target_vocab_size" in src
    assert VLLM().loads_d2t_at_full_vocab(version) is (not conditional), version
