"""The docs name only what exists: every repository path the README and docs/ put in backticks is a file or folder
of the repository, and a test or function named after it (``path::test_name``, ``path:function``; a trailing ``*``
is a prefix) is defined there.  And the project speaks of itself: no line anywhere speaks of how it was built (the
work's sittings, borrowed machines and their allowance): a figure names its date, machine and commit."""
import re
import subprocess

from helpers import ROOT

TOPS = ("roles/", "tests/", "docs/", "bench/", "deployer/", "templates/", "scripts/", "playbooks/", "inventory/",
        ".ci/")
TICKED = re.compile(r"`([^`\s]+)`")


def named(text: str, name: str) -> bool:
    prefix = name.endswith("*")
    pattern = r"^\s*(?:async\s+)?(?:def|class)\s+%s%s" % (re.escape(name.rstrip("*")), "" if prefix else r"\b")
    return re.search(pattern, text, re.M) is not None


def missing_in(doc) -> list:
    out = []
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        for tok in TICKED.findall(line):
            m = re.match(r"(.+?)(?:::|:(?=[A-Za-z_]))(.+)$", tok)
            path, name = (m.group(1), m.group(2)) if m else (tok, "")
            path = path.rstrip(".,;")
            if not path.startswith(TOPS) or any(c in path for c in "<>*{}$"):
                continue
            target = ROOT / path
            if not target.exists():
                out.append(f"{doc.name}:{n}: {tok}: no such file")
            elif name and target.is_file() and not named(target.read_text(), name.split("[")[0]):
                out.append(f"{doc.name}:{n}: {tok}: {path} defines no {name}")
    return out


def test_every_path_and_test_the_docs_name_exists():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert [m for d in docs for m in missing_in(d)] == []


def test_a_doc_naming_what_does_not_exist_is_caught(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("see `deployer/no_such.py`, `tests/unit/test_host_state.py::test_no_such_test`, "
                   "`deployer/plan.py:make_plan` and `tests/unit/test_host_state.py::test_ready_*`\n")
    assert missing_in(doc) == ["x.md:1: deployer/no_such.py: no such file",
                               "x.md:1: tests/unit/test_host_state.py::test_no_such_test: "
                               "tests/unit/test_host_state.py defines no test_no_such_test"]


WORDS = re.compile(r"\bsessions? [0-9]|\blent (gpu|machine|h100|h200)|device[ ](time|minutes)|"
                   r"\b(this|next)[ ]session", re.I)


def test_the_project_speaks_of_itself():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for f in files:
        p = ROOT / f
        if p.suffix in (".png", ".gz", ".xz", ".whl", ".bin") or not p.is_file():
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{f}:{n}: {line.strip()[:100]}" for n, line in enumerate(text.splitlines(), 1)
                 if WORDS.search(line)]
    assert hits == []
