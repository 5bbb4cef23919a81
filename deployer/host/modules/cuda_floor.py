#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: cuda_floor
short_description: Which GPU code an installed engine's CUDA libraries carry for the host's GPUs
description:
  - Read-only.  For each library of the venv matching I(libraries) (globs under its site-packages), the CUDA
    compilation units it holds, how many carry machine code (SASS) for each of I(compute_caps), how many only PTX
    (which the driver compiles at load) and the highest PTX ISA among those; and the CUDA version the venv's torch
    was built for.  Reads ELF and fatbin headers only (module_utils/fatbin.py), never the code.
  - The verify stage turns this into the driver the release needs (deployer/driver_floor.py) and refuses an older
    driver before anything restarts.
options:
  venv:
    description: The engine's venv.
    type: path
    required: true
  libraries:
    description: Globs relative to the venv's site-packages (the engine's cuda_libraries).
    type: list
    elements: str
    default: []
  compute_caps:
    description: The GPUs' compute capabilities as nvidia-smi reports them (C(12.0)).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: The same read-only reads.
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Read the venv's GPU code.
  cuda_floor:
    venv: /opt/deployer/venvs/vllm-0.16.0
    libraries: ["vllm/_moe_C*.so"]
    compute_caps: ["12.0"]
  register: floor
"""

RETURN = r"""
libraries:
  description:
    - One per library and compute capability - file (relative to site-packages), pattern, compute_cap, units, sass,
      ptx_only, none (units with no code this GPU can run), ptx_isa (the highest among the PTX-only units, or null),
      error (why it could not be read, or null).
  returned: always
  type: list
  elements: dict
torch_cuda:
  description: The CUDA version torch was built for (torch/version.py), or null (no torch, or a CPU build).
  returned: always
  type: str
"""

import glob
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fatbin import FatbinError, for_gpu, units


def site_packages(venv):
    found = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    return found[-1] if found else None


def torch_cuda(site):
    try:
        with open(os.path.join(site, "torch", "version.py")) as f:
            m = re.search(r"^cuda\b[^=\n]*=\s*['\"]([0-9.]+)['\"]", f.read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def main():
    m = AnsibleModule(argument_spec=dict(venv=dict(type="path", required=True),
                                         libraries=dict(type="list", elements="str", default=[]),
                                         compute_caps=dict(type="list", elements="str", default=[])),
                      supports_check_mode=True)
    p = m.params
    site = site_packages(p["venv"])
    if not site:
        m.fail_json(msg="cuda_floor: no site-packages under %s" % p["venv"])
    caps = []
    for cc in p["compute_caps"]:
        if not re.match(r"^\d+\.\d+$", cc or ""):
            m.fail_json(msg="cuda_floor: compute capability %r, expected MAJOR.MINOR" % (cc,))
        caps.append(cc)
    out = []
    for pattern in p["libraries"]:
        for path in sorted(glob.glob(os.path.join(site, pattern))):
            rel = os.path.relpath(path, site)
            try:
                found, error = units(path), None
            except (OSError, FatbinError, ValueError) as e:
                found, error = [], str(e)
            for cc in caps:
                major, minor = (int(x) for x in cc.split("."))
                out.append(dict(for_gpu(found, major, minor), file=rel, pattern=pattern, compute_cap=cc, error=error))
    m.exit_json(changed=False, libraries=out, torch_cuda=torch_cuda(site))


if __name__ == "__main__":
    main()
