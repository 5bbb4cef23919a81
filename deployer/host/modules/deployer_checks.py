#!/usr/bin/python
# -*- coding: utf-8 -*-
# Documentation only: the work is the action plugin of the same name (action_plugins/deployer_checks.py), which
# runs on the controller and reaches no host.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: deployer_checks
short_description: Run a list of checks in one task, each with its own refusal
description:
  - Evaluates each check in order, as M(ansible.builtin.assert) evaluates its conditions, and fails at the first
    check whose condition is false, with that check's message and its name (C(check)).  A message is templated only
    when it is shown.
  - A check may say a note instead of or beside its condition (shown by the deployer CLI at its stage, never a
    refusal), may run only C(when) its condition holds, and may run per item of a list (C(loop), with C(loop_var)
    and C(index_var) as a looped task has them), refusing with every failing item's message.
  - One task where there were one per check, each a worker process per host on the controller.
options:
  checks:
    description:
      - The checks, in order.  Each is a dict with C(name) (what is checked, shown when it refuses), C(that) (a
        condition or a list of them, as M(ansible.builtin.assert) takes them) with C(fail_msg) (the refusal, which
        says what was measured and what was expected), and optionally C(note), C(when), C(loop), C(loop_var)
        (default C(item)) and C(index_var).
      - Evaluated by the plugin, not before it runs; a check after a refusal, or one whose C(when) is false, is never
        evaluated.
    type: list
    elements: dict
    required: true
attributes:
  action:
    support: full
    description: Runs on the controller; it reaches no host.
  check_mode:
    support: full
    description: Only evaluates; the same in check mode.
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Ensure the host can take this deploy.
  deployer_checks:
    checks:
      - name: Ensure nvidia-smi answers.
        that: smi.rc == 0
        fail_msg: "nvidia-smi: measured rc={{ smi.rc }}; expected a working NVIDIA driver"
      - name: Ensure no GPU is in MIG mode.
        loop: "{{ gpus }}"
        index_var: i
        that: item.mig != 'Enabled'
        fail_msg: "GPU {{ i }}: measured MIG mode {{ item.mig }}; expected Disabled"
      - name: Say what may slow the load.
        note: "{{ warnings | join('; ') }}"
"""

RETURN = r"""
check:
  description: The name of the check that refused.
  returned: failed
  type: str
msg:
  description: The refusal (a list for a loop's failing items), or the notes joined, or how many checks passed.
  returned: always
  type: raw
notes:
  description: The notes the checks said, in order (empty ones left out); on a refusal, those said before it.
  returned: always
  type: list
  elements: str
"""
