#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: smoke_request
short_description: One chat completion between two reads of the server's /metrics, in one round trip
description:
  - Reads C(/metrics), sends one chat completion to C(/v1/chat/completions), reads C(/metrics) again, and
    returns all three, so the caller can prove the server answers and compute what the request did to the
    speculative-decoding counters.  The three requests used to be three C(uri) tasks (three round trips).
  - Never fails on an HTTP status, the caller judges it (the chat's status and body are returned).
options:
  host:
    description: The address the server is asked on (the plan's C(probe_host)); loopback when it binds all.
    type: str
    default: 127.0.0.1
  port:
    description: The server's port on I(host).
    type: int
    required: true
  model:
    description: The served model name.
    type: str
    required: true
  prompt:
    description: The user message.
    type: str
    required: true
  max_tokens:
    description: Tokens to generate.
    type: int
    default: 32
  api_key:
    description: Bearer token for the API (empty = none).
    type: str
    default: ""
  timeout_seconds:
    description: Per request.
    type: int
    default: 60
  sampled_temperature:
    description:
      - When above 0, one more chat completion at this temperature after the metrics' second read (the greedy
        one's counters stay its own).  The first non-greedy request takes the sampling kernels a greedy one never
        runs (the engine may compile them then, after the release went live).
    type: float
    default: 0
attributes:
  check_mode:
    support: full
    description: The same requests (they change nothing on the host but the server's counters).
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - deployer maintainers (@deployer)
"""

EXAMPLES = r"""
- name: Smoke test.
  smoke_request:
    port: 8000
    model: kimi-k2.5
    prompt: Say hello.
  register: smoke
"""

RETURN = r"""
status:
  description: HTTP status of the chat completion (0 when there was no answer).
  returned: always
  type: int
json:
  description: The chat completion's JSON body (empty when it was not JSON).
  returned: always
  type: dict
error:
  description: Why there was no answer, or the body's start when it was not JSON.
  returned: always
  type: str
metrics_before:
  description: The /metrics text before the request.
  returned: always
  type: str
metrics_after:
  description: The /metrics text after it.
  returned: always
  type: str
seconds:
  description: How long the greedy request took, end to end (prefill, decode, the HTTP round trip), seconds.
  returned: always
  type: float
completion_tokens:
  description: The greedy answer's completion tokens (its usage), 0 when it had none.
  returned: always
  type: int
tokens_per_second:
  description: completion_tokens / seconds of the greedy request (one request alone; with speculation, what the
    drafter gains or costs shows here), null without tokens.
  returned: always
  type: float
text:
  description: The greedy answer's text, its content without C(<think>) blocks, else its reasoning (empty when none).
  returned: always
  type: str
from_reasoning:
  description: Whether I(text) is the reasoning (vLLM's C(reasoning), SGLang's C(reasoning_content)), not the content.
  returned: always
  type: bool
degenerate:
  description: Why I(text) has the shape of a broken kernel and not of language (empty, one word or character
    repeated, replacement characters; module_utils answer_shape), empty when it has none.
  returned: always
  type: str
sampled:
  description: The sampled request's HTTP status, its completion tokens (the usage's count) and why there was no
    answer; null when I(sampled_temperature) is 0.
  returned: always
  type: dict
"""

import json
import time

from ansible.module_utils.answer_shape import answer_text, degenerate
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

# What root reads of the server's answers (issue 53 N10): the service user writes them, so a bound, as engine_watch
# and host_io have; vLLM's /metrics with EAGLE-3 is ~30 KB, one chat answer of smoke_max_tokens far less
READ_LIMIT = 4 << 20


def _get(url, timeout):
    try:
        return open_url(url, timeout=timeout).read(READ_LIMIT).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - the caller judges a missing /metrics
        return ""


def _chat(url, body, headers, timeout):
    """(status, JSON body as a dict, error) of one POST; status 0 when there was no answer."""
    status, text, error = 0, "", ""
    try:
        r = open_url(url, data=json.dumps(body), headers=headers, method="POST", timeout=timeout)
        status, text = r.getcode(), r.read(READ_LIMIT).decode("utf-8", "replace")
    except Exception as e:  # noqa: BLE001 - an HTTPError carries the status and body; anything else is no answer
        status = getattr(e, "code", 0) or 0
        try:
            text = e.read(READ_LIMIT).decode("utf-8", "replace") if hasattr(e, "read") else ""
        except Exception:  # noqa: BLE001
            text = ""
        error = "" if status else str(e)
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        data, error = {}, error or text[:300]
    return status, data if isinstance(data, dict) else {}, error


def main():
    m = AnsibleModule(argument_spec=dict(
        port=dict(type="int", required=True),
        host=dict(type="str", default="127.0.0.1"),
        model=dict(type="str", required=True),
        prompt=dict(type="str", required=True),
        max_tokens=dict(type="int", default=32, no_log=False),   # a count of tokens, not a secret
        api_key=dict(type="str", default="", no_log=True),
        timeout_seconds=dict(type="int", default=60),
        sampled_temperature=dict(type="float", default=0.0),
    ), supports_check_mode=True)
    p = m.params
    base = "http://%s:%d" % ("[%s]" % p["host"] if ":" in p["host"] else p["host"], p["port"])
    before = _get(base + "/metrics", p["timeout_seconds"])
    body = {"model": p["model"], "messages": [{"role": "user", "content": p["prompt"]}],
            "max_tokens": p["max_tokens"], "temperature": 0}
    headers = {"Content-Type": "application/json"}
    if p["api_key"]:
        headers["Authorization"] = "Bearer " + p["api_key"]
    t0 = time.monotonic()
    status, data, error = _chat(base + "/v1/chat/completions", body, headers, p["timeout_seconds"])
    seconds = round(time.monotonic() - t0, 3)
    after = _get(base + "/metrics", p["timeout_seconds"])
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    completion = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else 0
    choices = data.get("choices") if isinstance(data.get("choices"), list) else []
    text, from_reasoning = answer_text((choices[0] if choices and isinstance(choices[0], dict) else {}).get("message"))
    sampled = None
    if p["sampled_temperature"] > 0:
        s_status, s_data, s_error = _chat(base + "/v1/chat/completions",
                                          dict(body, temperature=p["sampled_temperature"]), headers,
                                          p["timeout_seconds"])
        tokens = (s_data.get("usage") or {}).get("completion_tokens") if isinstance(s_data.get("usage"), dict) else None
        sampled = dict(status=s_status, completion_tokens=tokens if isinstance(tokens, int) else 0,
                       error=s_error or (str(s_data.get("error"))[:300] if s_data.get("error") else ""))
    m.exit_json(changed=False, status=status, json=data, error=error, metrics_before=before, metrics_after=after,
                text=text, from_reasoning=from_reasoning, degenerate=degenerate(text) if status == 200 else "",
                sampled=sampled, seconds=seconds, completion_tokens=completion,
                tokens_per_second=round(completion / seconds, 1) if seconds > 0 and completion else None)


if __name__ == "__main__":
    main()
