"""vllm_watch's journal reading: byte-array and over-4096-byte messages (tqdm bars) are not lost."""
import json
import sys

from deployer.ansible_plugins.module_utils import vllm_logs
from deployer.ansible_plugins.module_utils.vllm_logs import LoadState

# Ansible ships module_utils to the host under ansible.module_utils.*; map it for an in-process import.
sys.modules.setdefault("ansible.module_utils.vllm_logs", vllm_logs)
from deployer.ansible_plugins.modules import vllm_watch  # noqa: E402


class FakeModule:
    def __init__(self, out):
        self.out = out
        self.calls = []

    def run_command(self, args):
        self.calls.append(args)
        return 0, self.out, ""


def test_journal_decodes_binary_messages_and_asks_for_all_fields():
    bar = "\r(Worker_TP0 pid=1) Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:10<00:10]" * 60
    lines = [
        {"MESSAGE": "(Worker_TP0 pid=1) INFO 11-29 10:00:00 [x.py:1] Starting to load model /m...",
         "__MONOTONIC_TIMESTAMP": "1000000"},
        {"MESSAGE": list(bar.encode()), "__MONOTONIC_TIMESTAMP": "2000000"},  # journald: control chars -> bytes
        {"MESSAGE": None, "__MONOTONIC_TIMESTAMP": "2500000"},
    ]
    m = FakeModule("\n".join(json.dumps(x) for x in lines))
    entries = vllm_watch.journal(m, "deployer-vllm", "abc")
    assert "--all" in m.calls[0] and "_SYSTEMD_INVOCATION_ID=abc" in m.calls[0]
    assert len(entries) == 2 and entries[1][0] == 2.0
    st = LoadState()
    for t, msg in entries:
        st.feed(msg, t)
    assert st.phase == "weights" and st.progress == (32, 64)
    assert st.phase_durations(3.0) == {"starting": 1.0, "weights": 1.0}
