"""Lookup plugin: the uv binary on the controller, to ship to hosts that have none."""
from __future__ import annotations

DOCUMENTATION = r"""
name: controller_uv
short_description: Path of the uv binary on the controller
description:
  - Returns the uv binary of the C(uv) Python package installed with the deployer (C(uv.find_uv_bin())).
  - Without that package (plain C(ansible-playbook) from a Python that has only ansible-core), the first
    C(uv) in the standard system directories or on C(PATH).
  - Fails with the install command when there is none.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Ship uv
  ansible.builtin.copy:
    src: "{{ lookup('controller_uv') }}"
    dest: /opt/deployer/bin/uv
    mode: "0755"
"""

RETURN = r"""
_raw:
  description: Absolute path of the uv binary on the controller.
  type: list
  elements: str
"""

import os
import shutil

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

SYSTEM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def find_uv() -> str | None:
    try:
        from uv import find_uv_bin
        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        pass
    for d in SYSTEM_DIRS:
        p = os.path.join(d, "uv")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return shutil.which("uv")


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        uv = find_uv()
        if not uv:
            raise AnsibleError("no uv on this controller to ship to the host: install it (pip install uv) "
                               "or set install_uv_src to a uv binary")
        return [uv]
