# -*- coding: utf-8 -*-
"""The deployer CLI's event stream: one JSON line per event, written to a pipe the CLI reads."""
from __future__ import annotations

DOCUMENTATION = r"""
name: deployer_events
type: aggregate
short_description: one JSON line per task event, for the deployer CLI
description:
  - The deployer CLI (deployer/runner.py) starts C(ansible-playbook) itself and reads this stream to show the
    stages, the load's progress and the run's one result (C(deployer_result)). Before, ansible-runner's
    C(awx_display) callback carried the same events, each one serialised, base64-encoded into the terminal
    stream, decoded, written to a file and read back (~1.5 CPU seconds of a deploy, docs/benchmarks.md).
  - Inert unless C(DEPLOYER_EVENTS_FD) names an open file descriptor, so plain C(ansible-playbook) loads it and
    writes nothing.
  - When active, also binds each of the playbook's workers to the playbook (C(PR_SET_PDEATHSIG) after every
    fork). ansible-core's workers call C(setsid()) and a death signal is not inherited across a fork, so a worker
    outlived a killed deployer (whose playbook dies with it) and went on acting on the host.
  - The event shapes are ansible-runner's (C(event), C(event_data) with C(host), C(task), C(role), C(res) ...);
    C(res) is what ansible-core gives callbacks, so a C(no_log) result arrives censored, and is censored again
    here should it ever carry C(_ansible_no_log) uncensored.
"""

import datetime
import json
import os

from ansible.plugins.callback import CallbackBase

CENSORED = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def _bind_workers() -> None:
    """Every process the playbook forks from now on (its workers) dies with its parent (deployer/pdeathsig.py).
    The playbook itself dies with the deployer (bound_process.spawn_bound), so no worker outlives a killed deployer:
    ansible-core's workers call setsid(), so a stop's kill of the playbook's process group missed them too.
    Imported only here: the callback is active only under the CLI, whose package is then importable."""
    from deployer.pdeathsig import bind_forks
    bind_forks()


def _censored(res: dict) -> dict:
    if res.get("_ansible_no_log"):
        return {"_ansible_no_log": True, "censored": CENSORED}
    return res


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "deployer_events"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        fd = os.environ.get("DEPLOYER_EVENTS_FD", "")
        self._out = None
        if fd.isdigit():
            try:
                self._out = os.fdopen(int(fd), "w", encoding="utf-8", closefd=False)
            except OSError:
                self._out = None
            else:
                _bind_workers()
        self._started: dict = {}

    def _emit(self, event: str, data: dict) -> None:
        if self._out is None:
            return
        try:
            self._out.write(json.dumps({"event": event, "event_data": data}, default=str) + "\n")
            self._out.flush()
        except (OSError, ValueError):   # the CLI went away: the playbook runs on (and dies with it: runner.py)
            self._out = None

    @staticmethod
    def _task(task) -> dict:
        d = {"task": task.name or task.action, "task_uuid": str(task._uuid), "task_action": task.action}
        role = getattr(task, "_role", None)
        if role is not None:
            d["role"] = role._role_name
        try:
            d["task_path"] = task.get_path()
        except AttributeError:
            pass
        return d

    def _result(self, event: str, result, **extra) -> None:
        if self._out is None:
            return
        host = result._host.get_name()
        start = self._started.get(host)
        end = datetime.datetime.now(datetime.timezone.utc)
        res = getattr(result, "result", None) or result._result     # ansible-core >= 2.19: .result
        data = dict(self._task(result._task), host=host, res=_censored(dict(res)), **extra)
        if start is not None:
            data.update(start=start.isoformat(), end=end.isoformat(), duration=(end - start).total_seconds())
        self._emit(event, data)

    def v2_runner_on_start(self, host, task):
        if self._out is None:
            return
        self._started[host.get_name()] = datetime.datetime.now(datetime.timezone.utc)
        self._emit("runner_on_start", dict(self._task(task), host=host.get_name()))

    def v2_runner_on_ok(self, result):
        self._result("runner_on_ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result("runner_on_failed", result, ignore_errors=bool(ignore_errors))

    def v2_runner_on_skipped(self, result):
        self._result("runner_on_skipped", result)

    def v2_runner_on_unreachable(self, result):
        self._result("runner_on_unreachable", result)

    def v2_runner_retry(self, result):
        self._result("runner_retry", result)

    def v2_playbook_on_stats(self, stats):
        self._emit("playbook_on_stats", {k: getattr(stats, k, {}) for k in
                                         ("changed", "dark", "failures", "ignored", "ok", "processed", "rescued",
                                          "skipped")})
