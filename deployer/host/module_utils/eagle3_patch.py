# -*- coding: utf-8 -*-
"""EAGLE-3 patch engine for vLLM + Kimi-K2.5 (patches P1-P5).

One file, standard library only: it runs on the controller (``deployer patch``)
and on the GPU host as Ansible ``module_utils`` (the ``vllm_eagle3_patch``
module), where nothing may be added to the vLLM venv.

What is needed is *detected from the installed source* (class bases, method
bodies, allow-list contents), never from a version table.  Every edit is keyed
on syntax: the ``ast`` tree names the class, method, loop, list or assignment to
change, and the edit is spliced at that node's exact source position, so the
rest of the file keeps every byte.  Patched files must compile.

Lifecycle, per vLLM package root:
  plan(root)    -> what would change (patch ids, unified diffs); changes nothing
  apply(root)   -> all files or none (temp files + rename; a manifest written
                   before the renames lets an interrupted apply be finished)
  revert(root)  -> originals back, byte for byte
State lives in ``<vllm root>/.deployer_patch/`` (manifest.json + orig/ copies).
A target file that matches neither its pristine nor its patched hash is
*drift*: the engine refuses and names the file.
"""
from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import tempfile

ENGINE_VERSION = "1"
STATE_DIR = ".deployer_patch"
MANIFEST = "manifest.json"

F_DSV2 = "model_executor/models/deepseek_v2.py"
F_K25 = "model_executor/models/kimi_k25.py"
F_SPEC = "config/speculative.py"
PROPOSER_FILES = ("v1/spec_decode/llm_base_proposer.py", "v1/spec_decode/eagle.py")
# Model Runner V2's EAGLE speculator: from vLLM 0.34 the only one (the v1/spec_decode proposers are gone)
MRV2_EAGLE = "v1/worker/gpu/spec_decode/eagle/speculator.py"
MRV2_SPEC_DECODE = "v1/worker/gpu/spec_decode"

# Text model types the EAGLE-3 allow-list must accept for Kimi-K2.5 (same as vLLM 0.18.0).
ALLOW_LIST_NAMES = ("eagle3_target_supported", "aux_hidden_states_supported")
ALLOW_LIST_ADD = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")
MIN_AUX_LAYERS = 7  # (2, n//2, n-3) is strictly increasing only for n >= 7

PATCH_TITLES = {
    "P1": "DeepseekV2Model: capture aux hidden states (hidden_states + residual) before listed layers",
    "P2": "DeepseekV2ForCausalLM: SupportsEagle3 + set/get aux hidden state layers",
    "P3": "KimiK25ForConditionalGeneration: SupportsEagle3 on the outer wrapper, delegating to language_model",
    "P4": "SpeculativeConfig: EAGLE-3 allow-list accepts deepseek_v2/v3 and kimi_k2/k25",
    "P5": "EAGLE proposer: Kimi-K2.5 image token from media_placeholder_token_id",
}


class PatchError(Exception):
    """A refusal: unsupported vLLM, unknown code shape, or drift.  ``str()`` is the operator message."""


class DriftError(PatchError):
    pass


# ---------------------------------------------------------------- small helpers
def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def _read(root, rel):
    with open(os.path.join(root, rel), "rb") as f:
        return f.read()


def _vllm_version(root):
    for rel, key in (("_version.py", "__version__"), ("version.py", "__version__")):
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            continue
        try:
            tree = ast.parse(_read(root, rel))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in (key, "version") for t in node.targets
            ):
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    return node.value.value
    return "unknown"


class _Src(object):
    """Source text plus an edit list of (start_offset, end_offset, replacement)."""

    def __init__(self, rel, data):
        self.rel = rel
        self.data = data
        self.text = data.decode("utf-8")
        self.tree = ast.parse(self.text, filename=rel)
        self.lines = self.text.splitlines(True)
        self._starts = [0]
        for line in self.lines:
            self._starts.append(self._starts[-1] + len(line))
        self.edits = []

    def off(self, lineno, col):
        # ast columns are UTF-8 byte offsets; convert to str offsets
        line = self.lines[lineno - 1]
        return self._starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8"))

    def node_start(self, node):
        return self.off(node.lineno, node.col_offset)

    def node_end(self, node):
        return self.off(node.end_lineno, node.end_col_offset)

    def line_start(self, lineno):
        return self._starts[lineno - 1]

    def line_end(self, lineno):  # offset just past the newline of that line
        return self._starts[lineno]

    def indent_of(self, node):
        line = self.lines[node.lineno - 1]
        return line[: len(line) - len(line.lstrip())]

    def replace(self, start, end, text):
        self.edits.append((start, end, text))

    def insert(self, at, text):
        self.edits.append((at, at, text))

    def result(self):
        out = self.text
        for start, end, text in sorted(self.edits, key=lambda e: (e[0], e[1]), reverse=True):
            out = out[:start] + text + out[end:]
        return out.encode("utf-8")


def _find_class(tree, name):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _find_method(cls, name):
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _base_names(cls):
    names = []
    for b in cls.bases:
        if isinstance(b, ast.Name):
            names.append(b.id)
        elif isinstance(b, ast.Attribute):
            names.append(b.attr)
    return names


def _mentions_attr(node, attr):
    return any(isinstance(n, ast.Attribute) and n.attr == attr for n in ast.walk(node))


def _is_self_attr(node, attr):
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _add_bases(src, cls, names):
    missing = [n for n in names if n not in _base_names(cls)]
    if missing:
        src.insert(src.node_end(cls.bases[-1]), ", " + ", ".join(missing))


def _add_import_names(src, module_suffix, anchor_name, names):
    """Add ``names`` to the ``from ...interfaces import`` statement that already imports ``anchor_name``."""
    for node in src.tree.body:
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").endswith(module_suffix)
            and any(a.name == anchor_name for a in node.names)
        ):
            have = {a.name for a in node.names}
            missing = [n for n in names if n not in have]
            if missing:
                src.insert(src.node_end(node.names[-1]), ", " + ", ".join(missing))
            return
    raise PatchError(
        "%s: no 'from %s import ... %s' statement to extend; vLLM layout not recognised"
        % (src.rel, module_suffix, anchor_name)
    )


def _append_to_class(src, cls, body_text):
    """Append methods (already indented for a class body) after the class's last statement."""
    last = cls.body[-1]
    src.insert(src.line_end(last.end_lineno), "\n" + body_text)


# ---------------------------------------------------------------- detection + edits per patch
def _detect_p1(src):
    cls = _find_class(src.tree, "DeepseekV2Model")
    if cls is None:
        raise PatchError("%s: class DeepseekV2Model not found" % src.rel)
    fwd = _find_method(cls, "forward")
    init = _find_method(cls, "__init__")
    if fwd is None or init is None:
        raise PatchError("%s: DeepseekV2Model has no __init__/forward" % src.rel)
    return cls, init, fwd, _mentions_attr(fwd, "aux_hidden_state_layers")


def _edit_p1(src, init, fwd):
    # __init__: initialise the (empty) set of layers to capture
    last = init.body[-1]
    ind = src.indent_of(last)
    src.insert(src.line_end(last.end_lineno), "%sself.aux_hidden_state_layers = tuple[int, ...]()\n" % ind)

    # forward: the decoder loop `for layer in islice(self.layers, self.start_layer, self.end_layer):`
    loops = [
        n for n in fwd.body
        if isinstance(n, ast.For)
        and isinstance(n.target, ast.Name)
        and isinstance(n.iter, ast.Call)
        and isinstance(n.iter.func, ast.Name)
        and n.iter.func.id == "islice"
        and n.iter.args
        and _is_self_attr(n.iter.args[0], "layers")
    ]
    if len(loops) != 1:
        raise PatchError("%s: DeepseekV2Model.forward: expected one 'for ... in islice(self.layers, ...)' loop, "
                         "found %d" % (src.rel, len(loops)))
    loop = loops[0]
    ind = src.indent_of(loop)
    body_ind = src.indent_of(loop.body[0])
    iter_src = src.text[src.node_start(loop.iter):src.node_end(loop.iter)]
    var = loop.target.id
    header = (
        "{i}aux_hidden_states = []\n"
        "{i}for idx, {v} in enumerate(\n"
        "{i}    {it},\n"
        "{i}    start=self.start_layer,\n"
        "{i}):\n"
        "{b}if idx in self.aux_hidden_state_layers:\n"
        "{b}    aux_hidden_states.append(hidden_states + residual)\n"
    ).format(i=ind, b=body_ind, v=var, it=iter_src)
    src.replace(src.line_start(loop.lineno), src.line_start(loop.body[0].lineno), header)

    # the final `return hidden_states`
    ret = fwd.body[-1]
    if not (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Name) and ret.value.id == "hidden_states"):
        raise PatchError("%s: DeepseekV2Model.forward does not end in 'return hidden_states'" % src.rel)
    ind = src.indent_of(ret)
    src.replace(
        src.line_start(ret.lineno), src.line_end(ret.end_lineno),
        "{i}if len(aux_hidden_states) > 0:\n{i}    return hidden_states, aux_hidden_states\n{i}return hidden_states\n"
        .format(i=ind),
    )


P2_METHODS = '''    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        self.model.aux_hidden_state_layers = layers

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        num_layers = len(self.model.layers)
        if num_layers < {min_layers}:
            raise ValueError(
                "EAGLE-3 default aux layers (2, n // 2, n - 3) need at least "
                f"{min_layers} decoder layers; this model has {{num_layers}}"
            )
        return (2, num_layers // 2, num_layers - 3)

    def get_eagle3_default_aux_hidden_state_layers(self) -> tuple[int, ...]:
        return self.get_eagle3_aux_hidden_state_layers()
'''.format(min_layers=MIN_AUX_LAYERS)

P3_METHODS = '''    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        self.language_model.set_aux_hidden_state_layers(layers)

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        return self.language_model.get_eagle3_aux_hidden_state_layers()

    def get_eagle3_default_aux_hidden_state_layers(self) -> tuple[int, ...]:
        return self.language_model.get_eagle3_aux_hidden_state_layers()
'''


def _find_allow_list(src):
    for node in ast.walk(src.tree):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ALLOW_LIST_NAMES
            and isinstance(node.value, ast.List)
        ):
            return node
    return None


def _allow_list_missing(node):
    have = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    # vLLM checks `supported in model_type` (substring), so "deepseek" would already cover deepseek_v3
    return [m for m in ALLOW_LIST_ADD if not any(h in m for h in have)]


def _find_p5_if(src):
    """The ``if``/``elif`` whose ``else`` is
    ``self.model.config.image_token_index = target_model.config.image_token_index``."""
    for node in ast.walk(src.tree):
        if isinstance(node, ast.If) and len(node.orelse) == 1 and isinstance(node.orelse[0], ast.Assign):
            a = node.orelse[0]
            if (
                len(a.targets) == 1
                and isinstance(a.targets[0], ast.Attribute)
                and a.targets[0].attr == "image_token_index"
                and isinstance(a.value, ast.Attribute)
                and a.value.attr == "image_token_index"
            ):
                return node
    return None


# ---------------------------------------------------------------- planning
class Plan(object):
    """What ``apply`` would do.  ``files`` maps relpath -> (pristine bytes, patched bytes)."""

    def __init__(self, root, version):
        self.root = root
        self.version = version
        self.needed = []       # patch ids
        self.native = []       # patch ids already present in the source
        self.files = {}

    @property
    def is_native(self):
        return not self.needed

    def diff(self):
        out = []
        for rel in sorted(self.files):
            before, after = self.files[rel]
            out.extend(difflib.unified_diff(
                before.decode("utf-8").splitlines(True), after.decode("utf-8").splitlines(True),
                "a/vllm/" + rel, "b/vllm/" + rel))
        return "".join(out)

    def fingerprint(self):
        return fingerprint_of(
            {rel: (sha256_bytes(b), sha256_bytes(a)) for rel, (b, a) in self.files.items()}, self.needed)

    def summary(self):
        return {
            "vllm_version": self.version,
            "needed": list(self.needed),
            "native": list(self.native),
            "files": sorted(self.files),
            "fingerprint": self.fingerprint() if self.needed else None,
        }


def fingerprint_of(file_hashes, patch_ids):
    h = hashlib.sha256()
    h.update(("engine=%s;patches=%s;" % (ENGINE_VERSION, ",".join(sorted(patch_ids)))).encode())
    for rel in sorted(file_hashes):
        pristine, patched = file_hashes[rel]
        h.update(("%s:%s:%s;" % (rel, pristine, patched)).encode())
    return h.hexdigest()[:16]


def _proposer_rel(root):
    for rel in PROPOSER_FILES:
        if os.path.exists(os.path.join(root, rel)):
            src = _Src(rel, _read(root, rel))
            if _find_p5_if(src) is not None or "media_placeholder_token_id" in src.text:
                return rel
    return None


class _Ctx(object):
    """What the detect/edit pairs share: the vLLM source files read once, and the classes found."""

    def __init__(self, root, version):
        self.root, self.version, self.srcs, self.native = root, version, {}, []

    def src(self, rel):
        if rel not in self.srcs:
            self.srcs[rel] = _Src(rel, _read(self.root, rel))
        return self.srcs[rel]


def _class(ctx, rel, name):
    cls = _find_class(ctx.src(rel).tree, name)
    if cls is None:
        raise PatchError("vLLM %s: class %s not found in %s" % (ctx.version, name, rel))
    return cls


# Each patch: detect(ctx) -> (already present?, what edit needs); edit(ctx, that).
def _p1_detect(ctx):
    _cls, init, fwd, native = _detect_p1(ctx.src(F_DSV2))
    return native, (init, fwd)


def _p1_edit(ctx, d):
    _edit_p1(ctx.src(F_DSV2), *d)


def _p2_detect(ctx):
    dcls = _class(ctx, F_DSV2, "DeepseekV2ForCausalLM")
    return "SupportsEagle3" in _base_names(dcls), dcls


def _p2_edit(ctx, dcls):
    dsv2 = ctx.src(F_DSV2)
    if "P1" in ctx.native and not _mentions_attr(dsv2.tree, "aux_hidden_state_layers"):
        raise PatchError("%s: inconsistent source (P1 present, no aux_hidden_state_layers)" % F_DSV2)
    _add_bases(dsv2, dcls, ["SupportsEagle3"])
    _add_import_names(dsv2, "interfaces", "SupportsEagle", ["SupportsEagle3"])
    _append_to_class(dsv2, dcls, P2_METHODS)


def _p3_detect(ctx):
    kcls = _class(ctx, F_K25, "KimiK25ForConditionalGeneration")
    return "SupportsEagle3" in _base_names(kcls), kcls


def _p3_edit(ctx, kcls):
    k25 = ctx.src(F_K25)
    _add_bases(k25, kcls, ["SupportsEagle", "SupportsEagle3"])
    _add_import_names(k25, "interfaces", "SupportsPP", ["SupportsEagle", "SupportsEagle3"])
    _append_to_class(k25, kcls, P3_METHODS)


def _p4_detect(ctx):
    allow = _find_allow_list(ctx.src(F_SPEC))   # absent from 0.22.0 on: nothing to do
    missing = _allow_list_missing(allow) if allow is not None else []
    return not missing, (allow, missing)


def _p4_edit(ctx, d):
    allow, missing = d
    spec = ctx.src(F_SPEC)
    spec.insert(spec.node_end(allow.value.elts[-1]), "".join(', "%s"' % m for m in missing))


def _mrv2_reads_image_token(root):
    """Whether any file of Model Runner V2's speculators reads ``image_token_index`` (P5's subject)."""
    for d, _dirs, files in os.walk(os.path.join(root, MRV2_SPEC_DECODE)):
        for name in files:
            if name.endswith(".py") and b"image_token_index" in _read(d, name):
                return True
    return False


def _p5_detect(ctx):
    prel = _proposer_rel(ctx.root)
    if prel is None:
        # vLLM 0.34+: no v1/spec_decode proposer at all; Model Runner V2's EAGLE speculator takes a multimodal
        # target's inputs as merged embeddings and never sets the drafter's image_token_index from the target's
        # config (what failed for Kimi-K2.5, whose config has media_placeholder_token_id): nothing to patch
        if (not any(os.path.exists(os.path.join(ctx.root, rel)) for rel in PROPOSER_FILES)
                and os.path.isfile(os.path.join(ctx.root, MRV2_EAGLE)) and not _mrv2_reads_image_token(ctx.root)):
            return True, None
        raise PatchError("vLLM %s: EAGLE proposer (%s, or %s without an image_token_index lookup) not recognised"
                         % (ctx.version, " or ".join(PROPOSER_FILES), MRV2_EAGLE))
    return "media_placeholder_token_id" in ctx.src(prel).text, prel


def _p5_edit(ctx, prel):
    prop = ctx.src(prel)
    node = _find_p5_if(prop)
    if node is None:
        raise PatchError("%s: no 'else: ... image_token_index = target_model.config.image_token_index' branch" % prel)
    # the `else:` line is the last line before the else body that reads 'else:'
    else_line = node.orelse[0].lineno - 1
    while else_line > node.lineno and prop.lines[else_line - 1].strip() != "else:":
        else_line -= 1
    if prop.lines[else_line - 1].strip() != "else:":
        raise PatchError("%s: could not locate the 'else:' of the image-token branch" % prel)
    line = prop.lines[else_line - 1]
    ind = line[: len(line) - len(line.lstrip())]
    prop.insert(prop.line_start(else_line), (
        '{i}elif self.get_model_name(target_model) == "KimiK25ForConditionalGeneration":\n'
        "{i}    self.model.config.image_token_index = (\n"
        "{i}        target_model.config.media_placeholder_token_id\n"
        "{i}    )\n").format(i=ind))


PATCHES = (
    ("P1", PATCH_TITLES["P1"], _p1_detect, _p1_edit),
    ("P2", PATCH_TITLES["P2"], _p2_detect, _p2_edit),
    ("P3", PATCH_TITLES["P3"], _p3_detect, _p3_edit),
    ("P4", PATCH_TITLES["P4"], _p4_detect, _p4_edit),
    ("P5", PATCH_TITLES["P5"], _p5_detect, _p5_edit),
)


def _refuse_unusable(ctx):
    """vLLM versions the patches cannot help: no Kimi-K2.5 at all, or the 0.15.x wrapper layout."""
    if not os.path.exists(os.path.join(ctx.root, F_K25)):
        raise PatchError(
            "vLLM %s cannot serve Kimi-K2.5: %s does not exist (KimiK25ForConditionalGeneration was added in 0.15.0; "
            "EAGLE-3 needs >= 0.16.0 with patches, >= 0.18.0 natively)" % (ctx.version, F_K25))
    for rel in (F_DSV2, F_SPEC):
        if not os.path.exists(os.path.join(ctx.root, rel)):
            raise PatchError("vLLM %s: %s missing; layout not recognised" % (ctx.version, rel))
    kinit = _find_method(_class(ctx, F_K25, "KimiK25ForConditionalGeneration"), "__init__")
    for node in ast.walk(kinit) if kinit else []:
        if (isinstance(node, ast.Assign) and any(_is_self_attr(t, "language_model") for t in node.targets)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "DeepseekV2Model"):
            raise PatchError(
                "vLLM %s is not supported: KimiK25ForConditionalGeneration.language_model is a bare DeepseekV2Model "
                "with its own lm_head (0.15.x layout); the EAGLE proposer cannot find embed_tokens/lm_head there. "
                "Use vLLM >= 0.16.0 (patched) or >= 0.18.0 (native)." % ctx.version)


def plan_from_sources(root):
    """Detect which of P1-P5 the source under ``root`` (the ``vllm`` package dir) needs, and make the edits."""
    ctx = _Ctx(root, _vllm_version(root))
    _refuse_unusable(ctx)
    plan = Plan(root, ctx.version)
    found = {}
    for pid, _title, detect, _edit in PATCHES:
        present, found[pid] = detect(ctx)
        (plan.native if present else plan.needed).append(pid)
    ctx.native = plan.native
    for pid, _title, _detect, edit in PATCHES:
        if pid in plan.needed:
            edit(ctx, found[pid])
    for rel, src in ctx.srcs.items():
        if src.edits:
            after = src.result()
            try:
                compile(after, rel, "exec", dont_inherit=True)
            except SyntaxError as e:  # never write a file that does not compile
                raise PatchError("%s: patched source does not compile: %s" % (rel, e)) from e
            plan.files[rel] = (src.data, after)
    return plan


# ---------------------------------------------------------------- state on disk
def _state(root):
    return os.path.join(root, STATE_DIR)


def read_manifest(root):
    path = os.path.join(_state(root), MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _atomic_write(path, data, mode=None):
    """Temp file + rename (never edits in place: the venv's files may be hard links into uv's cache).
    The mode is the replaced file's (else 0644): mkstemp's 0600 would hide the file from the service user."""
    d = os.path.dirname(path)
    if mode is None:
        mode = (os.stat(path).st_mode & 0o7777) if os.path.exists(path) else 0o644
    fd, tmp = tempfile.mkstemp(prefix=".deployer-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _check_manifest_files(root, manifest, allow):
    """Return {rel: 'pristine'|'patched'} or raise DriftError naming every drifted file."""
    states, drifted = {}, []
    for rel, info in sorted(manifest["files"].items()):
        cur = sha256_bytes(_read(root, rel))
        if cur == info["patched_sha256"] and "patched" in allow:
            states[rel] = "patched"
        elif cur == info["pristine_sha256"] and "pristine" in allow:
            states[rel] = "pristine"
        else:
            drifted.append(rel)
    if drifted:
        raise DriftError(
            "drift: %s under %s differ%s from both the pristine and the patched form recorded in %s/%s; "
            "refusing to touch it (reinstall this vLLM venv, or restore the file and retry)"
            % (", ".join(drifted), root, "s" if len(drifted) == 1 else "", STATE_DIR, MANIFEST))
    return states


def status(root):
    """Read-only: 'native' | 'unpatched' | 'patched' (+ details).  Raises on drift or unsupported vLLM."""
    manifest = read_manifest(root)
    if manifest is not None:
        states = _check_manifest_files(root, manifest, ("pristine", "patched"))
        full = all(s == "patched" for s in states.values()) and manifest.get("state") == "applied"
        return {"state": "patched" if full else "partial", "vllm_version": manifest["vllm_version"],
                "applied": manifest["patches"], "fingerprint": manifest["fingerprint"], "files": sorted(states)}
    plan = plan_from_sources(root)
    s = plan.summary()
    s["state"] = "native" if plan.is_native else "unpatched"
    return s


def apply(root, check_mode=False):
    """Apply what the source needs.  Returns a result dict with ``changed``, ``diff`` and ``fingerprint``."""
    root = os.path.abspath(root)
    manifest = read_manifest(root)
    if manifest is not None:
        states = _check_manifest_files(root, manifest, ("pristine", "patched"))
        todo = [rel for rel, s in states.items() if s == "pristine"]
        if not todo and manifest.get("state") == "applied":
            return _result(False, manifest["vllm_version"], manifest["patches"], manifest["fingerprint"],
                           "", "already patched (%s), nothing to do" % ", ".join(manifest["patches"]))
        # an interrupted apply: finish it from the recorded patched copies
        if not check_mode:
            for rel in todo:
                _atomic_write(os.path.join(root, rel), _read(_state(root), "patched/" + rel))
            manifest["state"] = "applied"
            _atomic_write(os.path.join(_state(root), MANIFEST), json.dumps(manifest, indent=2).encode())
        return _result(True, manifest["vllm_version"], manifest["patches"], manifest["fingerprint"], "",
                       "finished an interrupted apply (%d file(s))" % len(todo))

    plan = plan_from_sources(root)
    if plan.is_native:
        return _result(False, plan.version, [], None, "",
                       "native support in vLLM %s (%s present), nothing to patch"
                       % (plan.version, ", ".join(plan.native)))
    diff = plan.diff()
    fp = plan.fingerprint()
    msg = "patched vLLM %s: %s" % (plan.version, ", ".join(plan.needed))
    if check_mode:
        return _result(True, plan.version, plan.needed, fp, diff,
                       "would patch vLLM %s: %s" % (plan.version, ", ".join(plan.needed)))

    state = _state(root)
    # 1. keep originals and the patched copies, then the manifest (state "applying")
    for rel, (before, after) in plan.files.items():
        for sub, data in (("orig", before), ("patched", after)):
            p = os.path.join(state, sub, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            _atomic_write(p, data)
    manifest = {
        "engine_version": ENGINE_VERSION, "vllm_version": plan.version, "patches": plan.needed,
        "fingerprint": fp, "state": "applying",
        "files": {rel: {"pristine_sha256": sha256_bytes(b), "patched_sha256": sha256_bytes(a)}
                  for rel, (b, a) in plan.files.items()},
    }
    _atomic_write(os.path.join(state, MANIFEST), json.dumps(manifest, indent=2).encode())
    # 2. swap every file in by rename (a crash here is finished by the next apply)
    done = []
    try:
        for rel, (_before, after) in sorted(plan.files.items()):
            mode = os.stat(os.path.join(root, rel)).st_mode & 0o7777
            _atomic_write(os.path.join(root, rel), after, mode)
            done.append(rel)
    except BaseException:
        for rel in done:  # all or nothing
            _atomic_write(os.path.join(root, rel), plan.files[rel][0])
        _remove_state(root)
        raise
    manifest["state"] = "applied"
    _atomic_write(os.path.join(state, MANIFEST), json.dumps(manifest, indent=2).encode())
    return _result(True, plan.version, plan.needed, fp, diff, msg)


def revert(root, check_mode=False):
    root = os.path.abspath(root)
    manifest = read_manifest(root)
    if manifest is None:
        return _result(False, _vllm_version(root), [], None, "", "no deployer patch recorded, nothing to revert")
    states = _check_manifest_files(root, manifest, ("pristine", "patched"))
    diff = []
    for rel in sorted(states):
        if states[rel] == "patched":
            orig = _read(_state(root), "orig/" + rel)
            if sha256_bytes(orig) != manifest["files"][rel]["pristine_sha256"]:
                raise DriftError("backup of %s in %s/orig is damaged; reinstall the vLLM venv" % (rel, STATE_DIR))
            diff.extend(difflib.unified_diff(
                _read(root, rel).decode("utf-8").splitlines(True), orig.decode("utf-8").splitlines(True),
                "a/vllm/" + rel, "b/vllm/" + rel))
    if not check_mode:
        for rel in sorted(states):
            if states[rel] == "patched":
                mode = os.stat(os.path.join(root, rel)).st_mode & 0o7777
                _atomic_write(os.path.join(root, rel), _read(_state(root), "orig/" + rel), mode)
        _remove_state(root)
    return _result(True, manifest["vllm_version"], manifest["patches"], manifest["fingerprint"], "".join(diff),
                   "reverted %s" % ", ".join(manifest["patches"]))


def _remove_state(root):
    state = _state(root)
    for dirpath, _dirnames, filenames in os.walk(state, topdown=False):
        for f in filenames:
            os.unlink(os.path.join(dirpath, f))
        os.rmdir(dirpath)


def _result(changed, version, patches, fingerprint, diff, msg):
    return {"changed": changed, "vllm_version": version, "patches": list(patches),
            "fingerprint": fingerprint, "diff": diff, "msg": msg}


def vllm_root_of(python_or_root):
    """Accept a vllm package dir, a site-packages dir or a venv dir; return the vllm package dir."""
    p = os.path.abspath(python_or_root)
    if os.path.basename(p) == "vllm" and (os.path.isfile(os.path.join(p, "__init__.py"))
                                          or os.path.isdir(os.path.join(p, "model_executor"))):
        return p
    if os.path.isdir(os.path.join(p, "vllm")):
        return os.path.join(p, "vllm")
    lib = os.path.join(p, "lib")
    if os.path.isdir(lib):
        for d in sorted(os.listdir(lib)):
            cand = os.path.join(lib, d, "site-packages", "vllm")
            if os.path.isdir(cand):
                return cand
    raise PatchError("no vllm package found under %s" % python_or_root)
