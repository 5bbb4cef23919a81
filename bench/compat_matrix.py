#!/usr/bin/env python3
"""The engine-release matrix from each release's own source: every vLLM minor from 0.16 to the newest on the package
index, every SGLang release from 0.5.12 to the newest, read from the wheels (no install: the source and the wheel's
metadata), and docs/compatibility.md written from what was measured (with the date and the deployer commit).

Per vLLM release: what the patch engine detects on its real files (patched / native / refused, by detection), which
of the watcher's wordings its source prints, the load strategies and speculative-config keys its own config classes
declare, whether its speculative config still refuses a non-DeepSeek EAGLE-3 target before the load, where it reads
a drafter's aux layer ids, the Model Runner V2 default, and its torch pin.  Per SGLang release: the capability probe
the patch stage runs on the installed source (Kimi-K2.5 class, its EAGLE-3 hook, the MLA drafter class), where it
reads aux layer ids, its torch pin.

What this does NOT run (it needs each release installed, ~11 GB with torch and CUDA libraries): the engine's own
checks on the rendered argv, the stand-in on that release and the smoke.  CI runs those on 0.16.0 (patched) and
0.18.0 (first native) and SGLang 0.5.23; the real GPU runs are vLLM 0.20.0 (docs/real-engine.md).

    .venv/bin/python bench/compat_matrix.py            # all; wheels cached under ~/.cache/deployer/wheels
    .venv/bin/python bench/compat_matrix.py --vllm 0.16.0 0.33.0 --sglang 0.5.23
"""
from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from deployer.host.module_utils import eagle3_patch as pe  # noqa: E402
from deployer.host.module_utils import fatbin, sglang_source  # noqa: E402
from deployer.versions import vtuple  # noqa: E402
from helpers import CACHE  # noqa: E402

WHEELS = CACHE / "wheels"
# what the watcher (module_utils/load_rules.py) reads, as literal fragments of the source that prints it
WORDINGS = {
    "shards bar": "Loading safetensors checkpoint shards",
    "weights took": "Loading weights took",
    "drafter": "Loading drafter model",
    "compile took": "torch.compile took",
    "compile takes (<0.18)": "torch.compile takes",
    "cache hit (0.16/0.18)": "Directly load the compiled graph",
    "cache hit AOT (0.20+)": "Directly load AOT compilation",
    "cache miss": "Compiling a graph for compile range",
    "KV tokens": "GPU KV cache size",
    "graphs bar": "Capturing CUDA graphs",
    "init engine": "init engine (profile, create kv cache",
    "server on": "Starting vLLM server on",
    "API server 0 on": "Starting vLLM API server",
    "prefetch bar": "Prefetching checkpoint files",
    "multi-thread bar": "Multi-thread loading shards",
    # Model Runner V2 (v1/worker/gpu/; the only runner of 0.34): its start line and the EAGLE-3 aux-layers line
    # that opens the drafter phase
    "MRv2 start": "Loading model from scratch",
    "MRv2 aux layers": "Using Eagle3 auxiliary layers from",
}


def versions(pkg: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", pkg], capture_output=True, text=True).stdout
    m = re.search(r"Available versions: (.*)", out)
    return [v.strip() for v in m.group(1).split(",")] if m else []


def latest_per_minor(all_versions: list[str], lo: tuple) -> list[str]:
    best: dict = {}
    for v in all_versions:
        if not re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", v) or vtuple(v) < lo:
            continue
        key = vtuple(v)[:2]
        if key not in best or vtuple(v) > vtuple(best[key]):
            best[key] = v
    return [best[k] for k in sorted(best)]


def wheel(pkg: str, version: str) -> Path:
    WHEELS.mkdir(parents=True, exist_ok=True)
    found = sorted(WHEELS.glob(f"{pkg}-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", *[a for n in (35, 34, 31, 28, 27, 24, 17)
                                                      for a in ("--platform", f"manylinux_2_{n}_x86_64")],
                        "-d", str(WHEELS), f"{pkg}=={version}"],
                       check=True, capture_output=True)
        found = sorted(WHEELS.glob(f"{pkg}-{version}-*.whl"))
    return found[0]


def install_check(pkg: str, version: str) -> str:
    """Whether uv can resolve ``pkg==version`` with its pinned dependencies against the package index this machine
    uses, for a Debian 12 host (Python 3.11, glibc 2.36: manylinux_2_36): "ok", or "not installable here: " and
    uv's cause (vLLM 0.34.0 pins flashinfer-python==0.7.3, which the index does not have: the install stage would
    fail on it)."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    # a cache of its own: a resolution against the live index refreshes the cached index pages, and the sandbox's
    # offline installs resolve from the shared cache's pages - a newer sentry-sdk listed there, its wheel not
    # cached, failed every sandbox install of the suite run that shared the machine with this bench (2026-12-04)
    env = dict(os.environ, UV_CACHE_DIR=str(CACHE / "uv-bench"))
    r = subprocess.run([uv, "pip", "compile", "-q", "--no-header", "--python-version", "3.11",
                        "--python-platform", "x86_64-manylinux_2_36", "-"], input=f"{pkg}=={version}\n",
                       capture_output=True, text=True, timeout=600, env=env)
    if r.returncode == 0:
        return "ok"
    cause = [ln.strip() for ln in r.stderr.splitlines() if ln.strip().startswith("cause:")] or r.stderr.splitlines()
    return "not installable here: " + " ".join((cause[0] if cause else "uv failed").split())[:240].removeprefix(
        "cause: ")


def torch_pin(z: zipfile.ZipFile) -> str:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        m = re.match(r"Requires-Dist: torch\s*(?:\(([^)]*)\)|([=<>!~][^;]*))?\s*(;.*)?$", line)
        if m and "extra ==" not in (m.group(3) or ""):
            return (m.group(1) or m.group(2) or "any").strip()
    return "-"


def spec_fields(src: str) -> list[str]:
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeConfig":
            return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return []


DLR = {"declared": "accepted (its own flag)", "inverse": "accepted (--enable-log-requests' inverse: off)",
       "refused": "refused by its parser"}


def disable_log_requests(allsrc: str) -> str:
    """What that release's parser does with ``--disable-log-requests``: ``declared`` (its own flag, deprecated in
    0.16), ``inverse`` (not declared, but 0.33's FlexibleArgumentParser pairs every ``--enable-x`` boolean with a
    ``--disable-x`` that sets it false: EnableDisableAction in vllm/utils/argparse_utils.py, and
    ``--enable-log-requests`` is one), or ``refused`` (its parser exits with "unrecognized arguments")."""
    if "disable-log-requests" in allsrc or "disable_log_requests" in allsrc:
        return "declared"
    if '"--enable-": "--disable-"' in allsrc and '"--enable-log-requests"' in allsrc:
        return "inverse"
    return "refused"


def kernels_sm120(z: zipfile.ZipFile) -> dict:
    """Which GPU code the wheel's kernel libraries (deployer/engines/vllm.py cuda_libraries) carry for sm_120, read as
    the verify stage reads the installed venv (module_utils/fatbin.py), and the driver that PTX needs
    (deployer/driver_floor.py; the torch CUDA major is not in the wheel: the verify stage adds it)."""
    import fnmatch

    from deployer import driver_floor as df
    from deployer.engines import get
    libs = []
    with tempfile.TemporaryDirectory() as d:
        for pattern in get("vllm").cuda_libraries:
            for name in sorted(n for n in z.namelist() if fnmatch.fnmatch(n, pattern)):
                path = z.extract(name, d)
                libs.append(dict(fatbin.for_gpu(fatbin.units(path), 12, 0), file=name, compute_cap="12.0"))
                os.unlink(path)
    floor = df.floor(libs, None)
    ptx = [lib for lib in libs if lib["ptx_only"]]
    return {"driver": floor["driver"], "ptx_only": sum(lib["ptx_only"] for lib in libs),
            "ptx_isa": max((lib["ptx_isa"] for lib in ptx), key=lambda v: tuple(map(int, v.split("."))), default=None),
            "libraries": [f"{lib['file'].rsplit('/', 1)[-1]} {lib['ptx_only']}/{lib['units']}" for lib in ptx]}


def vllm_row(version: str) -> dict:
    row: dict = {"engine": "vLLM", "version": version}
    try:
        path = wheel("vllm", version)
    except subprocess.CalledProcessError as e:
        return dict(row, error=f"not installable here: {e.stderr.decode()[-300:].strip()}")
    row["install"] = install_check("vllm", version)
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        py = {n: z.read(n).decode("utf-8", "replace") for n in names if n.endswith(".py") and n.startswith("vllm/")}
        row["torch"] = torch_pin(z)
        row["kernels_sm120"] = kernels_sm120(z)
        with tempfile.TemporaryDirectory() as d:
            for rel in pe.__dict__.get("FILES", ()) or ():
                if rel in names:
                    z.extract(rel, d)
            for rel in ("vllm/model_executor/models/deepseek_v2.py", "vllm/model_executor/models/kimi_k25.py",
                        "vllm/config/speculative.py", "vllm/v1/spec_decode/eagle.py",
                        "vllm/v1/spec_decode/llm_base_proposer.py", "vllm/__init__.py", "vllm/_version.py",
                        "vllm/version.py"):
                if rel in names:
                    z.extract(rel, d)
            for rel in names:   # Model Runner V2's speculators: P5's detection reads them when no proposer exists
                if rel.startswith("vllm/" + pe.MRV2_SPEC_DECODE + "/") and rel.endswith(".py"):
                    z.extract(rel, d)
            try:
                plan = pe.plan_from_sources(str(Path(d) / "vllm"))
                row["patch"] = ("patched: " + ", ".join(plan.needed)) if plan.needed else "native"
            except pe.PatchError as e:
                row["patch"] = "refused: " + str(e)[:160]
    allsrc = "\n".join(py.values())
    row["wordings"] = sorted(k for k, frag in WORDINGS.items() if frag in allsrc)
    load = py.get("vllm/config/load.py", "")
    m = re.search(r"safetensors_load_strategy:\s*([^=\n]+)=[^\n]*\n(\s*\"\"\"(?:.|\n)*?\"\"\")?", load)
    literal = re.findall(r'"(\w+)"', m.group(1)) if m else []
    documented = re.findall(r'^\s*- "(\w+)"', m.group(2) or "", re.M) if m else []
    row["load_strategies"] = literal or documented
    row["spec_keys"] = [k for k in ("attention_backend", "kv_cache_dtype", "draft_attention_backend",
                                    "draft_kv_cache_dtype", "rejection_sample_method")
                        if k in spec_fields(py.get("vllm/config/speculative.py", "class X: pass"))]
    spec_src = py.get("vllm/config/speculative.py", "")
    row["eagle3_target_check"] = ("Eagle3 is only supported for" in spec_src
                                  or "is only supported for {aux_hidden_states_supported}" in spec_src)
    runner = py.get("vllm/v1/worker/gpu_model_runner.py", "")
    top = ("hf_config.eagle_aux_hidden_state_layer_ids" in runner
           or re.search(r"(?:getattr|hasattr)\(hf_config, \"eagle_aux_hidden_state_layer_ids\"", runner))
    nested = 'eagle_config.get("eagle_aux_hidden_state_layer_ids")' in runner
    row["aux_ids"] = ("top-level, else eagle_config" if top and nested else "top-level only" if top else "?")
    head = py.get("vllm/model_executor/models/llama_eagle3.py", "")
    row["fc_sizing"] = ("len(eagle_config ids) x hidden" if "num_aux_hidden_states = len(layer_ids)" in head
                        else "3 x hidden" if "hidden_size * 3" in head else "?")
    envs = py.get("vllm/envs.py", "")
    m = re.search(r'os\.getenv\(\s*"VLLM_USE_V2_MODEL_RUNNER",\s*("?\w+"?)', envs)
    row["model_runner_v2_default"] = ({'"1"': "on", '"0"': "off", "None": "auto"}.get(m.group(1), m.group(1))
                                      if m else "-")
    row["disable_log_requests"] = disable_log_requests(allsrc)
    from deployer.source_check import missing_imports
    row["verifier_missing"] = missing_imports((ROOT / "roles/verify/files/vllm_verify.py").read_text(), "vllm", py.get)
    return row


def sglang_row(version: str) -> dict:
    row: dict = {"engine": "SGLang", "version": version}
    try:
        path = wheel("sglang", version)
    except subprocess.CalledProcessError as e:
        return dict(row, error=f"not installable here: {e.stderr.decode()[-300:].strip()}")
    row["install"] = install_check("sglang", version)
    with zipfile.ZipFile(path) as z, tempfile.TemporaryDirectory() as d:
        row["torch"] = torch_pin(z)
        for n in z.namelist():
            if n.startswith("sglang/srt/") and n.endswith(".py") or n in ("sglang/version.py", "sglang/__init__.py"):
                z.extract(n, d)
        root = str(Path(d) / "sglang")
        try:
            cap = sglang_source.capability(root, "LlamaForCausalLMEagle3")
            row["capability"] = cap if isinstance(cap, dict) else {"result": str(cap)}
        except Exception as e:  # noqa: BLE001 - a release the probe refuses is a row too
            row["capability"] = {"refused": f"{type(e).__name__}: {e}"[:200]}
        aux = Path(d, "sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py")
        runner = Path(d, "sglang/srt/model_executor/model_runner.py")
        text = (aux.read_text() if aux.exists() else "") + (runner.read_text() if runner.exists() else "")
        row["aux_ids"] = "eagle_config (nested)" if re.search(
            r"eagle_config(?:\.get\(|\[)\s*[\"']eagle_aux_hidden_state_layer_ids", text) else "?"
    return row


def _kernels(k: dict | None) -> str:
    if not k:
        return "-"
    if not k["ptx_only"]:
        return "machine code"
    return f"PTX {k['ptx_isa']} only: {', '.join(k['libraries'])}; driver >= {k['driver']}"


def table(rows: list[dict], commit: str, today: str = "") -> str:
    today = today or datetime.date.today().isoformat()
    out = [f"# Engine releases, measured\n\nGenerated by `bench/compat_matrix.py` on {today} at deployer commit "
           f"`{commit}` from each release's own wheel (its source and metadata; nothing installed). Regenerate: "
           "`.venv/bin/python bench/compat_matrix.py`.\n",
           "What each column is: **patch** what the patch engine detects on that release's real files (patched with "
           "which of P1-P5, native, or refused, by detection, never by a version list); **wordings** which of the "
           "watcher's log lines its source prints; **load** the `--safetensors-load-strategy` choices its LoadConfig "
           "declares (the deployer passes only those the installed release's own parser accepts: the verify stage); "
           "**spec keys** the speculative-config fields among those the deployer cares about; **EAGLE-3 target "
           "check** whether its speculative config still refuses a non-DeepSeek/Llama EAGLE-3 target before the load "
           "(when not, the deployer's own pre-load checks are the only early ones); **aux ids** where it reads a "
           "drafter's aux layer ids and **drafter fc** how it sizes the drafter's fc (both: the drafter check, "
           "`deployer/engines/vllm.py`); **MRv2** Model Runner V2's default (`VLLM_USE_V2_MODEL_RUNNER`); **verifier** "
           "whether every name the deployer's verify script imports from vLLM exists in that release "
           "(`deployer/source_check.py`; a missing one fails the verify stage: until 2026-12-01 the verifier took "
           "`validate_parsed_serve_args` from `entrypoints/openai/cli_args.py`, which 0.29-0.33 do not have); "
           "**--disable-log-requests** what its parser does with that flag, read from its source (its own flag; the "
           "inverse every `--enable-x` boolean gets from 0.33's parser; or refused); "
           "**sm_120 kernels** whether the Kimi kernel libraries (`_moe_C`, `_C`, FA2) carry sm_120 machine code or "
           "only PTX, which the driver compiles at load, and the driver that PTX needs (`deployer/driver_floor.py`; "
           "measured for the wheels in this machine's cache: `--kernels-only`); "
           "**torch** its pin (the GPU machine "
           "machine has torch 2.11); **installs** whether uv resolves the release with its pinned dependencies "
           "against the package index this bench used, for a Debian 12 host (Python 3.11), or why not (the install "
           "stage would fail the same way on a host using that index).\n",
           "Not run per release (each needs ~11 GB installed): the engine's own checks on the rendered argv, the "
           "stand-in reading that release's lines, the watcher and the smoke. CI runs them on vLLM 0.16.0 and 0.18.0 "
           "and SGLang 0.5.23, and on vLLM 0.33.0 the stand-in's lines and the verifier's imports (0.33.0 was deployed "
           "in the sandbox by hand on 2026-12-01: `deployer up --sandbox -e deployer_vllm_version=0.33.0`, its own "
           "checks passed, it loaded, served and was released); on vLLM 0.34.0 (Model Runner V2 only) CI runs the "
           "patch engine and the stand-in on its wheel's own source, but it cannot be installed here (see installs); "
           "vLLM 0.20.0 and 0.25.1 ran on a real H200 "
           "(docs/real-engine.md). `deployer versions` reads the same rows (`deployer/data/compatibility.json`) "
           "with that evidence and says what each release gives on given GPUs.\n",
           "## vLLM\n",
           "| vLLM | patch | wordings the watcher matches | load | spec keys | EAGLE-3 target check | aux ids | "
           "drafter fc | MRv2 | --disable-log-requests | verifier | torch | sm_120 kernels | installs |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["engine"] != "vLLM":
            continue
        if r.get("error"):
            out.append(f"| {r['version']} | {' '.join(r['error'].split())[-160:]} | | | | | | | | | | | | |")
            continue
        out.append(f"| {r['version']} | {r['patch']} | {', '.join(r['wordings'])} | {'/'.join(r['load_strategies'])} "
                   f"| {', '.join(r['spec_keys']) or '-'} | {'yes' if r['eagle3_target_check'] else 'no'} | "
                   f"{r['aux_ids']} | {r['fc_sizing']} | {r['model_runner_v2_default']} | "
                   f"{DLR[r['disable_log_requests']]} | "
                   f"{('lacks ' + ', '.join(r['verifier_missing'])) if r['verifier_missing'] else 'ok'} | "
                   f"{r['torch']} | {_kernels(r.get('kernels_sm120'))} | {r.get('install', '-')} |")
    out += ["", "## SGLang\n", "| SGLang | capability probe (Kimi-K2.5 + EAGLE-3, Llama drafter) | aux ids | torch | "
            "installs |", "|---|---|---|---|---|"]
    for r in rows:
        if r["engine"] != "SGLang":
            continue
        if r.get("error"):
            out.append(f"| {r['version']} | {r['error']} | | | |")
            continue
        cap = r["capability"]
        text = cap.get("refused") or ("; ".join(cap["problems"]) if cap.get("problems") else
                                      "serves it: Kimi-K2.5 class, EAGLE-3 hook, drafter class "
                                      f"{cap.get('drafter_class')}")
        out.append(f"| {r['version']} | {text} | {r['aux_ids']} | {r['torch']} | {r.get('install', '-')} |")
    return "\n".join(out) + "\n"


def evidence() -> dict:
    """Where each release has run, from the repository itself: the versions the CI set-up prepares and deploys in
    the sandbox (scripts/dev.sh's test command) and the real-GPU recordings (tests/fixtures/real-gpu/<engine>-
    <version>-<gpu>..., each with the nvidia-smi line of its machine)."""
    dev = (ROOT / "scripts" / "dev.sh").read_text()
    test_line = next(ln for ln in dev.splitlines() if ln.strip().startswith("test)")) + "\n" + \
        dev.split("  test)", 1)[1].split(";;", 1)[0]
    defaults = {m.group(1): m.group(2) for m in re.finditer(r"prepare_(\w+)\(\) \{ prepare_engine \w+ "
                                                             r"\"\$\{1:-([\w.]+)\}\"", dev)}
    ci: dict = {"vLLM": [], "SGLang": []}
    for m in re.finditer(r"prepare_(vllm|sglang)(?: ([\w.]+))?", test_line):
        ci["vLLM" if m.group(1) == "vllm" else "SGLang"].append(m.group(2) or defaults[m.group(1)])
    real = []
    for d in sorted((ROOT / "tests" / "fixtures" / "real-gpu").iterdir()):
        m = re.fullmatch(r"(vllm|sglang)-(\d[\w.]*?)-(\w+)(-.*)?", d.name)
        smi = next(iter(sorted(d.glob("**/nvidia-smi.txt"))), None)
        if not m or smi is None:
            continue
        parts = [p.strip() for p in smi.read_text().splitlines()[0].split(",")]
        real.append({"engine": "vLLM" if m.group(1) == "vllm" else "SGLang", "version": m.group(2), "dir": d.name,
                     "gpu": parts[0], "compute_cap": parts[4] if len(parts) > 4 else "?"})
    # the real engine's CPU build the real-engine sandbox serves (deployer/sandbox/real_engine.py), with its recordings
    from deployer.sandbox import real_engine
    real_cpu = [{"engine": "vLLM", "version": real_engine.VERSION, "build": real_engine.PACKAGE,
                 "dir": f"{real_engine.PACKAGE}-{real_engine.VERSION}"}]
    return {"ci": {k: sorted(set(v), key=vtuple) for k, v in ci.items()}, "real_gpu": real, "real_cpu": real_cpu}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm", nargs="*")
    ap.add_argument("--sglang", nargs="*")
    ap.add_argument("--out", default=str(ROOT / "docs" / "compatibility.md"))
    ap.add_argument("--data", default=str(ROOT / "deployer" / "data" / "compatibility.json"),
                    help="the same rows as data, with the evidence: what `deployer versions` reads")
    ap.add_argument("--render-only", action="store_true", help="rewrite --out from the rows in --data (no wheels)")
    ap.add_argument("--kernels-only", action="store_true",
                    help="add the sm_120 kernels column to --data's rows from the wheels already cached (no download)")
    a = ap.parse_args()
    if a.kernels_only:
        data = json.loads(Path(a.data).read_text())
        for r in data["rows"]:
            cached = sorted(WHEELS.glob(f"vllm-{r['version']}-*.whl")) if r["engine"] == "vLLM" else []
            if cached and not r.get("error"):
                with zipfile.ZipFile(cached[0]) as z:
                    r["kernels_sm120"] = kernels_sm120(z)
                print(r["version"], json.dumps(r["kernels_sm120"]), flush=True)
        Path(a.data).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        Path(a.out).write_text(table(data["rows"], data["commit"], data["generated"]))
        return 0
    if a.render_only:
        data = json.loads(Path(a.data).read_text())
        Path(a.out).write_text(table(data["rows"], data["commit"], data["generated"]))
        return 0
    ev = evidence()
    # the newest release of every minor, and every release something ran (CI's, the real GPU's)
    named = {r["version"] for r in ev["real_gpu"] if r["engine"] == "vLLM"} | set(ev["ci"]["vLLM"])
    vl = a.vllm if a.vllm is not None else sorted(set(latest_per_minor(versions("vllm"), (0, 16, 0))) | named,
                                                  key=vtuple)
    sg = a.sglang if a.sglang is not None else [v for v in versions("sglang")
                                                 if re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", v)
                                                 and vtuple(v) >= (0, 5, 12)][::-1]
    rows = []
    for v in vl:
        rows.append(vllm_row(v))
        print(json.dumps(rows[-1]), flush=True)
    for v in sg:
        rows.append(sglang_row(v))
        print(json.dumps(rows[-1]), flush=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    Path(a.out).write_text(table(rows, commit))
    Path(a.data).parent.mkdir(exist_ok=True)
    Path(a.data).write_text(json.dumps({"generated": datetime.date.today().isoformat(), "commit": commit,
                                        "rows": rows, "evidence": ev}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
