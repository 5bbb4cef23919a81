"""Action plugin: the whole no-op check of ``deployer up`` in one task per host (issue 24).

Plans on this controller, reads the host in one round trip (the ``deployer_state`` module), binds the plan to what
the host measured, renders the unit and env file here exactly as the render stage will (the same
``ansible.builtin.template`` lookup on the same templates) and compares them, by sha256, with what runs.  When there is
nothing to do it also records the run: the play's result (``result_from``, set as a fact) and its audit line
(``audit_line_from``, appended on the host by one shell command over the same connection).  Six tasks per host were
one worker fork each; on a 2-core controller with 8 hosts those forks were most of the no-op's time
(docs/benchmarks.md).  The logic is the deployer package's (deployer/noop.py, the filters' own functions): this file
only wires it.  Documented in modules/deployer_noop_check.py (ansible-core's layout for an action-backed module).
"""
from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

try:
    import deployer  # noqa: F401  (installed, or already importable)
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import yaml  # noqa: E402
from ansible.errors import AnsibleError  # noqa: E402
from ansible.plugins.action import ActionBase  # noqa: E402
from ansible.plugins.loader import lookup_loader  # noqa: E402
from ansible.template import trust_as_template  # noqa: E402

from deployer import noop  # noqa: E402
from deployer.ansible_plugins.filter_plugins import deployer_filters as filters  # noqa: E402
from deployer.host.modules import deployer_noop_check as doc  # noqa: E402

# the templates the render stage writes (roles/render/tasks/main.yml), rendered here only to be hashed
TEMPLATES = ("engine.service.j2", "engine.env.j2")
KEEPER_TEMPLATE = "state-keeper.service.j2"   # the host's state keeper's unit, when the plan keeps the host's state
# The arguments are checked against the options the module's documentation declares (one definition; the keys an
# argument spec takes, the descriptions dropped).
ARGUMENT_SPEC = {name: {k: v for k, v in opt.items() if k in ("type", "elements", "required", "default", "choices")}
                 for name, opt in yaml.safe_load(doc.DOCUMENTATION)["options"].items()}
AUDIT_FILE = "audit.jsonl"     # <root>/audit.jsonl, as tasks/finish.yml appends it
# result_from / audit_line_from name a play variable; the name goes into a template this plugin evaluates, so it must
# be a name and nothing else (Jinja's and Ansible's variable names)
VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]   # a bad argument fails the task here
        missing = [k for k in ("root", "service", "templates_dir") if not args.get(k)]
        if missing:
            return dict(result, failed=True, msg="empty required arguments: " + ", ".join(missing))
        bad = ["%s: got %r, expected a variable name" % (k, args[k]) for k in ("result_from", "audit_line_from")
               if args.get(k) and not VAR_NAME.fullmatch(args[k])]
        if bad:
            return dict(result, failed=True, msg="; ".join(bad))
        # bad or unknown settings: no plan, no verdict; the full deploy's preflight says what is wrong
        result.update(changed=False, noop=False, plan=None, release=None, fingerprint=None, patches=None,
                      reasons=None)
        if args.get("settings_unknown"):
            return result
        src = args.get("drafter_src_dir") or ""
        manifest = filters.drafter_manifest(src, False) if src else None
        the_plan = filters.deployer_plan_or_none(args["settings"], manifest)
        if the_plan is None:
            return result
        result["plan"] = the_plan
        state = self._execute_module(
            module_name="deployer_state", task_vars=task_vars,
            module_args={"root": args["root"], "service": args["service"], "secrets": args.get("secrets"),
                         "probe": {"venv": the_plan["venv"], "patchable": the_plan["engine"]["patchable"],
                                   "drafter_dir": (the_plan.get("drafter") or {}).get("dir") or "",
                                   "port": the_plan["port"], "host": the_plan["probe_host"],
                                   "files": [(the_plan["unit"].get("line_splitter") or ""),
                                             the_plan["secrets"]["dropin_path"]]
                                   + sorted((the_plan.get("state_keeper") or {}).get("files") or {})
                                   + ([the_plan["state_keeper"]["unit_path"]] if the_plan.get("state_keeper")
                                      else [])
                                   + sorted((the_plan.get("gpu_gate") or {}).get("files") or {})
                                   + ([the_plan["gpu_gate"]["dropin_path"]] if the_plan.get("gpu_gate") else [])}})
        state.pop("invocation", None)          # its arguments hold the live secrets (no_log there, dropped here)
        if state.get("failed"):
            return dict(result, failed=True, msg="reading the host: " + str(state.get("msg") or state))
        bound = filters.deployer_plan_devices(
            the_plan, filters.nvidia_device_allow((state.get("probe") or {}).get("nvidia_devices"),
                                                  args.get("device_allow_extra")), False)
        if bound is None:
            return result
        expected = noop.expected_release(bound, state)
        unit_sha, env_sha = (hashlib.sha256(self._render(name, task_vars, bound, expected).encode()).hexdigest()
                             for name in TEMPLATES)
        keeper_sha = (hashlib.sha256(self._render(KEEPER_TEMPLATE, task_vars, bound, expected).encode()).hexdigest()
                      if bound.get("state_keeper") else None)
        result.update(noop.noop_check(expected, state, bound, unit_sha, env_sha, keeper_sha))
        if result["noop"]:
            # said as a debug task says it: the CLI prints the msg (deployer/output.py), plain ansible-playbook the
            # result (_ansible_verbose_always, as ansible.builtin.debug sets it); the plan is no longer needed (the
            # play ends for this host), so the result shown is short
            result.update(plan=None, _ansible_verbose_always=True,
                          msg="release %s is already live and serving (unit, env file, venv patches, drafter and "
                              "/health checked in one round trip); nothing to do" % result["release"])
            self._record(result, args, task_vars)
        return result

    def _record(self, result, args, task_vars):
        """The run's result and audit line, as the play defines them (its variables ``result_from`` and
        ``audit_line_from``), evaluated as the play would after this task: with this verdict registered, the run ok,
        the live release its release.  The result becomes a fact (``deployer_result``, what the CLI reads); the audit
        line is appended to ``<root>/audit.jsonl`` as tasks/finish.yml appends a lock-free run's (not in check mode).
        """
        if not args.get("result_from"):
            return
        available = dict(task_vars, deployer_noop=dict(result), deployer_ok=True,
                         deployer_target_release=result["release"])
        templar = self._templar.copy_with_new_env(available_variables=available)
        run_result = templar.template(trust_as_template("{{ %s }}" % args["result_from"]))
        result["ansible_facts"] = {"deployer_result": run_result}
        if not args.get("audit_line_from") or self._task.check_mode:
            return
        available["deployer_result"] = run_result
        line = templar.copy_with_new_env(available_variables=available).template(
            trust_as_template("{{ %s | to_json(sort_keys=true) }}" % args["audit_line_from"]))
        path = "%s/%s" % (args["root"].rstrip("/"), AUDIT_FILE)
        res = self._low_level_execute_command(filters.audit_append(line, args["root"]))
        if res.get("rc") != 0:
            # as the raw task it replaces: a lost audit line is reported, never a failed no-op
            self._display.warning("could not append the audit line to %s: %s" % (path, (res.get("stderr") or "")
                                                                                 .strip()[:300]))

    def _render(self, name, task_vars, bound, expected):
        """One template as the render stage renders it: its lookup, its variables, its ``ansible_managed``."""
        path = str(Path(self._task.args["templates_dir"]) / name)
        lookup = lookup_loader.get("ansible.builtin.template", loader=self._loader, templar=self._templar)
        if lookup is None:
            raise AnsibleError("the ansible.builtin.template lookup is missing")
        template_vars = {"render_plan": bound,
                         "render_patch": {"fingerprint": expected["fingerprint"], "patches": expected["patches"]},
                         "__render_id": expected["id"],
                         "__render_dir": "%s/%s" % (bound["dirs"]["releases"], expected["id"])}
        return lookup.run([path], variables=task_vars, template_vars=template_vars)[0]
