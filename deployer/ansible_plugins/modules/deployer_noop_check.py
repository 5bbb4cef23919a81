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
  - Only reads.
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
attributes:
  action:
    support: full
    description: Runs on the controller; its one host round trip is C(deployer_state).
  check_mode:
    support: full
    description: Only reads; runs the same in check mode.
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
reasons:
  description: What differs, one sentence each (empty when I(noop)); null when the check could not be made.
  returned: always
  type: list
  elements: str
"""
