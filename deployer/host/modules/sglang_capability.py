#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_capability
short_description: Check from its installed source that an SGLang venv can serve Kimi-K2.5 with an EAGLE-3 drafter
description:
  - Reads the installed SGLang with Python's C(ast) (no import) for the Kimi-K2.5 class, its EAGLE-3 hook
    C(set_eagle3_layers_to_capture) and the drafter's model class.
  - SGLang itself checks the hook only after the model weights are loaded; this check runs before any restart.
  - Read-only; fails with what is missing and the installed version.
options:
  venv:
    description: The SGLang venv (or the sglang package directory itself).
    type: path
    required: true
  draft_architecture:
    description: The drafter's C(architectures[0]) from its config.json; empty when speculative decoding is off.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Reads only; the same result in check mode.
  diff_mode:
    support: none
    description: Changes nothing, so there is nothing to diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Ensure this SGLang can serve Kimi-K2.5 with the MLA drafter.
  sglang_capability:
    venv: /opt/deployer/venvs/sglang-0.5.23
    draft_architecture: Eagle3DeepseekV2ForCausalLM
"""

RETURN = r"""
version:
  description: Version of the installed SGLang.
  returned: always
  type: str
  sample: 0.5.23
target_class:
  description: KimiK25ForConditionalGeneration exists.
  returned: always
  type: bool
eagle3_hook:
  description: KimiK25ForConditionalGeneration defines set_eagle3_layers_to_capture.
  returned: always
  type: bool
drafter_class:
  description: The file that defines the drafter's class, or null.
  returned: always
  type: str
  sample: srt/models/llama_eagle3.py
msg:
  description: What was found, in words.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_source import SourceError, capability, sglang_root_of


def main():
    module = AnsibleModule(
        argument_spec=dict(venv=dict(type="path", required=True),
                           draft_architecture=dict(type="str", default="")),
        supports_check_mode=True,
    )
    try:
        res = capability(sglang_root_of(module.params["venv"]), module.params["draft_architecture"])
    except SourceError as e:
        module.fail_json(msg=str(e))
    problems = res.pop("problems")
    if problems:
        module.fail_json(msg="; ".join(problems), **res)
    module.exit_json(changed=False, msg="SGLang %s has %s with %s%s" % (
        res["version"], "KimiK25ForConditionalGeneration", "set_eagle3_layers_to_capture" if res["eagle3_hook"]
        else "no EAGLE-3 hook (not needed: speculation off)",
        " and %s (%s)" % (module.params["draft_architecture"], res["drafter_class"]) if res["drafter_class"] else ""),
        **res)


if __name__ == "__main__":
    main()
