"""Lookup plugin: who this run is, for the deploy lock's holder record (deployer/controller_id.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
name: controller_identity
short_description: This controller's machine id and boot id, and the run's long-lived process (pid, start time)
description:
  - Returns one dict, C(machine_id), C(boot_id), C(pid) and C(pid_start) (clock ticks since boot), naming the
    run's process so that no other controller and no reused pid is ever taken for it.
  - The term is the run's pid (the C(deployer) CLI passes its own); without one, the parent of the process that
    evaluates the lookup (Ansible's worker), which is C(ansible-playbook) itself.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Who holds the lock
  ansible.builtin.set_fact:
    owner: "{{ lookup('controller_identity', deployer_run_pid | default('')) }}"
"""

RETURN = r"""
_raw:
  description: One dict, C(machine_id), C(boot_id), C(pid), C(pid_start).
  type: list
  elements: dict
"""

import sys
from pathlib import Path

from ansible.plugins.lookup import LookupBase

try:
    from deployer import controller_id
except ImportError:   # plain ansible-playbook from a Python without this package: the repository's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from deployer import controller_id


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        pid = next((t for t in terms if str(t).strip()), None)
        return [controller_id.identity(int(pid) if pid else None)]
