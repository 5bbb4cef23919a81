#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_eagle3_patch
short_description: Apply or revert the EAGLE-3 patches (P1-P5) a vLLM venv needs to serve Kimi-K2.5
description:
  - Detects from the installed vLLM source which of P1-P5 are needed (class bases, method bodies,
    allow-list contents; not a version table) and applies exactly those, atomically.
  - On a vLLM with native support (>= 0.18.0) it changes nothing. On one that cannot serve Kimi-K2.5
    (< 0.16.0) it fails with a message naming the version and what is missing.
  - Refuses when a target file differs from both its pristine and patched form (drift).
options:
  venv:
    description: The vLLM venv (or the vllm package directory itself).
    type: path
    required: true
  state:
    description: C(present) applies what is needed; C(absent) restores the originals byte for byte.
    type: str
    choices: [present, absent]
    default: present
attributes:
  check_mode:
    support: full
    description: Reports what would change and changes nothing.
  diff_mode:
    support: full
    description: Returns a before/after diff of what it changes.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Ensure vLLM has the EAGLE-3 patches Kimi-K2.5 needs.
  vllm_eagle3_patch:
    venv: /opt/deployer/venvs/vllm-0.16.0
  register: patch

- name: Restore the pristine vLLM sources.
  vllm_eagle3_patch:
    venv: /opt/deployer/venvs/vllm-0.16.0
    state: absent
"""

RETURN = r"""
vllm_version:
  description: Version of the vLLM package found.
  returned: always
  type: str
  sample: 0.16.0
patches:
  description: Patch ids applied (or reverted) by the deployer.
  returned: always
  type: list
  sample: [P1, P2, P3, P4, P5]
fingerprint:
  description: Hash of the patch set as applied (engine version, patch ids, pristine and patched file hashes);
    null when native.
  returned: always
  type: str
  sample: 75a1a42a725bbbc8
native:
  description: True when this vLLM needs no patch.
  returned: always
  type: bool
msg:
  description: What happened, in words.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.eagle3_patch import PatchError, apply, revert, status, vllm_root_of


def main():
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
        ),
        supports_check_mode=True,
    )
    try:
        root = vllm_root_of(module.params["venv"])
        if module.params["state"] == "present":
            res = apply(root, check_mode=module.check_mode)
        else:
            res = revert(root, check_mode=module.check_mode)
        st = status(root) if not module.check_mode else None
    except PatchError as e:
        module.fail_json(msg=str(e))
    out = dict(changed=res["changed"], vllm_version=res["vllm_version"], patches=res["patches"],
               fingerprint=res["fingerprint"], msg=res["msg"],
               native=(st or {}).get("state") == "native" or (not res["patches"] and not res["changed"]),
               vllm_root=root)
    if module._diff and res["diff"]:
        out["diff"] = {"prepared": res["diff"]}
    module.exit_json(**out)


if __name__ == "__main__":
    main()
