#!/usr/bin/python
# -*- coding: utf-8 -*-
# Documentation only: the work is the action plugin of the same name (action_plugins/deployer_noop_check.py),
# which runs on the controller and calls deployer_state on the host.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: deployer_noop_check
short_description: Decide in one task whether a deploy has nothing to do
description:
  - Makes the deploy plan on the controller (none with unknown or bad settings), reads the host in one round trip
    (C(deployer_state) with a probe), binds the plan to the NVIDIA device classes the host has, renders the unit
    and the environment file on the controller as the render stage would, and compares everything with what runs.
  - Nothing to do when the planned release is already live byte for byte, the venv carries the patches it was
    verified with, the drafter is complete and unchanged, systemd runs the unit and C(/health) answers 200.
  - When there is nothing to do it records the run, as the play defines it, so that the play can end for the host
    without another task, each a worker process per host, most of an 8-host no-op's time on a 2-core controller.
    It evaluates the play variable named by I(result_from) with its own verdict registered as C(deployer_noop),
    C(deployer_ok) true and C(deployer_target_release) the live release, and returns it as the fact
    C(deployer_result); then, not in check mode, it appends the play variable named by I(audit_line_from) (one
    JSON line) to I(root)/audit.jsonl on the host with one shell command over the same connection.  A line that
    cannot be appended is a warning, as for a run that holds no lock (C(tasks/finish.yml)).
  - Otherwise only reads.
options:
  settings:
    description: The deploy settings as the plan takes them (C(deployer_settings)).
    type: dict
    required: true
  settings_unknown:
    description: Setting names the deployer does not know; any makes the check return no plan (the full deploy
      then refuses them).
    type: list
    elements: str
    default: []
  drafter_src_dir:
    description: The drafter checkpoint on the controller, hashed into the plan; empty without speculative decoding.
    type: path
    default: ""
  root:
    description: The deploy root (C(deployer_root)).
    type: path
    required: true
  service:
    description: The systemd unit name of the server.
    type: str
    required: true
  secrets:
    description: The live secret files as the deploy would write them; compared on the host, never returned.
    type: dict
  device_allow_extra:
    description: Extra C(DeviceAllow=) entries beyond the NVIDIA classes the host reports.
    type: list
    elements: str
    default: []
  templates_dir:
    description: The directory of C(engine.service.j2) and C(engine.env.j2).
    type: path
    required: true
  result_from:
    description: The name of the play variable that defines the run's result (C(deployer_run_result)); empty records
      no result.  A name only (letters, digits, C(_)); anything else fails the task, as it would be evaluated.
    type: str
    default: ""
  audit_line_from:
    description: The name of the play variable that defines the run's audit line (C(deployer_audit_line)), made from
      the result; empty (or no I(result_from)) appends no line.  A name only, as for I(result_from).
    type: str
    default: ""
attributes:
  action:
    support: full
    description: Runs on the controller; it reaches the host with C(deployer_state) and, on a no-op, one shell command.
  check_mode:
    support: full
    description: Only reads in check mode (the result is still returned; no audit line is appended).
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Check for a no-op
  deployer_noop_check:
    settings: "{{ deployer_settings }}"
    root: /opt/deployer
    service: deployer-engine
    templates_dir: "{{ playbook_dir }}/../templates"
    result_from: deployer_run_result
    audit_line_from: deployer_audit_line
  register: deployer_noop
"""

RETURN = r"""
noop:
  description: True when there is nothing to do.
  returned: always
  type: bool
plan:
  description: The run's deploy plan (deployer/plan.py), not yet bound to the host's devices; null with bad settings
    and when I(noop) (nothing follows that needs it).
  returned: always
  type: dict
release:
  description: The release id the full deploy would render; null without a plan.
  returned: always
  type: str
fingerprint:
  description: The EAGLE-3 patch fingerprint of the venv, or null.
  returned: always
  type: str
patches:
  description: The patches the venv carries.
  returned: always
  type: list
  elements: str
msg:
  description: The sentence that says there is nothing to do (which release is live and what was checked).
  returned: when I(noop)
  type: str
ansible_facts:
  description: When I(noop) and I(result_from) is set, the run's result.
  returned: when I(noop)
  type: dict
  contains:
    deployer_result:
      description: The play's I(result_from) variable, evaluated with this task's verdict.
      type: dict
      returned: when I(noop) and I(result_from) is set
reasons:
  description: What differs, one sentence each (empty when I(noop)); null when the check could not be made.
  returned: always
  type: list
  elements: str
"""
