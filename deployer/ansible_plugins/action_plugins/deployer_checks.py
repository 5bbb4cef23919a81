"""Action plugin: a list of checks in one task, each with its own refusal, evaluated in order on the controller.

Each check was an ``ansible.builtin.assert`` task of its own, and each task is a worker process forked from the
playbook's main process per host: on a 2-core controller those forks were the largest share of a changed deploy's
CPU (docs/benchmarks.md).  This plugin keeps each check's own condition and message and runs them as ``assert``
does (``evaluate_conditional`` on the trusted condition; the message templated only when it is shown), stopping at
the first refusal, whose name it returns as ``check``.  A check may also say a note (shown, never refusing) and may
run per item of a list (``loop``), refusing with every failing item's message, as a looped ``assert`` did.
Documented in modules/deployer_checks.py (ansible-core's layout for an action-backed module).
"""
from __future__ import annotations

import collections

from ansible.plugins.action import ActionBase

KEYS = {"name", "that", "fail_msg", "note", "when", "loop", "loop_var", "index_var"}


def _problems(checks) -> list[str]:
    """What is wrong with the ``checks`` argument itself (a playbook's mistake, said before any check runs)."""
    if not isinstance(checks, list) or not checks:
        return ["checks: expected a non-empty list of checks"]
    out = []
    for i, c in enumerate(checks):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            out.append(f"checks[{i}]: expected a dict with a name")
            continue
        unknown = sorted(set(c) - KEYS)
        if unknown:
            out.append(f"checks[{i}] ({c['name']}): unknown keys {', '.join(unknown)}")
        if ("that" in c) != ("fail_msg" in c):
            out.append(f"checks[{i}] ({c['name']}): that and fail_msg go together")
        if "that" not in c and "note" not in c:
            out.append(f"checks[{i}] ({c['name']}): expected that and fail_msg, or a note")
    return out


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    @classmethod
    def finalize_task_arg(cls, name, value, templar, context):
        if name == "checks":     # evaluated in run(), in order, only as far as the first refusal
            return value
        return super().finalize_task_arg(name, value, templar, context)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        checks = self._task.args.get("checks")
        bad = _problems(checks) + [f"unknown argument {k}" for k in self._task.args if k != "checks"]
        if bad:
            return dict(result, failed=True, msg="; ".join(bad))
        notes = []
        for c in checks:
            if "when" in c and not self._templar.evaluate_conditional(conditional=c["when"]):
                continue
            refusals = []
            for templar in self._each(c):
                if "that" in c:
                    thats = c["that"] if isinstance(c["that"], list) else [c["that"]]
                    if not all(templar.evaluate_conditional(conditional=t) for t in thats):
                        refusals.append(str(templar.template(c["fail_msg"])))
                        continue
                if "note" in c:
                    note = templar.template(c["note"])
                    if note:
                        notes.append(str(note))
            if refusals:
                # the notes said before the refusal are kept: what only slows the load is said beside what refuses it
                return dict(result, failed=True, check=str(self._templar.template(c["name"])), notes=notes,
                            msg=refusals[0] if len(refusals) == 1 and "loop" not in c else refusals)
        return dict(result, changed=False, notes=notes, msg="; ".join(notes) or "%d checks passed" % len(checks))

    def _each(self, c):
        """The templar each evaluation of the check uses: this task's, or one per item of its loop (the item and
        its index as variables, as a looped task's loop_var and index_var)."""
        if "loop" not in c:
            yield self._templar
            return
        items = self._templar.template(c["loop"])
        for i, item in enumerate(items or []):
            local = {c.get("loop_var", "item"): item}
            if c.get("index_var"):
                local[c["index_var"]] = i
            yield self._templar.copy_with_new_env(
                available_variables=collections.ChainMap(local, self._templar.available_variables))
