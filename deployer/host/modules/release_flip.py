#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_flip
short_description: Make a release live in one round trip - previous, current, manifest, prune
description:
  - Runs only after the release passed its smoke test.  Keeps the release that was live as C(previous)
    (the rollback target), points C(current) at I(release_dir) (each link replaced by an atomic rename),
    records I(result) and I(facts) in the release's manifest, then keeps the newest I(keep) releases (never
    C(current) or C(previous)) and removes the venvs and drafters no kept release uses.
  - The same steps as the release_record module plus the prune (module_utils/releases.py prune) and the two links,
    in one module, because each task costs a round trip and a rollback should cost little more than its server's load.
options:
  root:
    description: The deploy root holding C(current), C(previous), C(releases/), C(venvs/), C(drafters/).
    type: path
    required: true
  release_dir:
    description: The release to make live.
    type: path
    required: true
  record:
    description: Record I(facts) even when C(current) does not move (the server was restarted into it).
    type: bool
    default: true
  facts:
    description: Facts for the manifest (phase durations, downtime, acceptance...).
    type: dict
    default: {}
  keep:
    description: Releases to keep (at least 2).
    type: int
    default: 5
  in_use:
    description: Venv and drafter paths the running deploy needs, never removed.
    type: list
    elements: path
    default: []
  uv_cache_dir:
    description:
      - The host's uv cache. When a venv is collected, the cache entries no venv uses any more (none of their
        files has another hard link) go too, so that removing a venv gives its disk back.
    type: path
attributes:
  check_mode:
    support: full
    description: Reports what would change and changes nothing.
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Make the release live.
  release_flip:
    root: /opt/deployer
    release_dir: /opt/deployer/releases/0123456789ab
    facts: {load_seconds: 612.4}
    in_use: [/opt/deployer/venvs/vllm-0.16.0-p1a2b3c4d]
"""

RETURN = r"""
current:
  description: The release C(current) points at now.
  returned: always
  type: str
previous:
  description: The release C(previous) points at now (null when there was none).
  returned: always
  type: str
moved:
  description: Whether C(current) moved.
  returned: always
  type: bool
removed:
  description: Release ids pruned.
  returned: always
  type: list
collected:
  description: Venv and drafter directories removed because no kept release uses them.
  returned: always
  type: list
speculation_payoff:
  description: EAGLE-3's speed-up on this host, when the recorded I(facts) hold a C(tokens_per_second) and the host
    has a release of the same engine and model served the other way (with the drafter against without it) that
    recorded its own; null otherwise.  Keys - the two releases and their tokens per second, C(speedup), C(pays),
    C(mean_acceptance_length), C(step_ms), C(plain_step_ms), C(break_even_acceptance_length).
  returned: always
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.releases import prune, read_releases, record, relink
from ansible.module_utils.spec_payoff import compare


def main():
    m = AnsibleModule(argument_spec=dict(root=dict(type="path", required=True),
                                         release_dir=dict(type="path", required=True),
                                         record=dict(type="bool", default=True),
                                         facts=dict(type="dict", default={}),
                                         keep=dict(type="int", default=5),
                                         in_use=dict(type="list", elements="path", default=[]),
                                         uv_cache_dir=dict(type="path")),
                      supports_check_mode=True)
    p = m.params
    root, rel = p["root"], p["release_dir"].rstrip("/")
    cur_link, prev_link = os.path.join(root, "current"), os.path.join(root, "previous")
    old = os.readlink(cur_link) if os.path.islink(cur_link) else None
    moved = old != rel
    changed = False
    if moved and old:
        changed |= relink(prev_link, old, m.check_mode)
    if moved:
        changed |= relink(cur_link, rel, m.check_mode)
    payoff = None
    if p["record"] or moved:
        facts = dict(p["facts"])
        if facts.get("tokens_per_second") is not None:
            # EAGLE-3 against no speculation, from this host's own releases, kept in the record: the release it
            # was measured against may be pruned later
            others = read_releases(os.path.join(root, "releases"))
            me = next((r for r in others if r["id"] == os.path.basename(rel)), {"id": os.path.basename(rel)})
            payoff = compare(dict(me, **facts), others)
            if payoff:
                facts["speculation_payoff"] = payoff
        changed |= record(rel, "live", facts, m.check_mode)[0]
    removed, _kept, collected = prune(os.path.join(root, "releases"), p["keep"], [cur_link, prev_link],
                                      os.path.join(root, "venvs"), os.path.join(root, "drafters"), p["in_use"],
                                      m.check_mode, p["uv_cache_dir"])
    prev = os.readlink(prev_link) if os.path.islink(prev_link) else None
    m.exit_json(changed=changed or bool(removed or collected), moved=moved, removed=removed, collected=collected,
                current=rel, previous=(old if moved and old else prev), speculation_payoff=payoff)


if __name__ == "__main__":
    main()
