"""A GPU the driver has given up on is refused before a 25-minute load (deployer/host/module_utils/gpu_health.py):
each refusal class and warning from nvidia-smi's fields and the kernel's Xid lines, as the sandbox's nvidia-smi
prints them (deployer/sandbox/nvidia_smi.py answers the same query)."""
import sys
from pathlib import Path

import pytest

from deployer.host.module_utils import gpu_health
from deployer.host.module_utils.gpu_health import FIELDS, judge, parse_rows, pci_key, xid_events

sys.path.insert(0, str(__import__("pathlib").Path(gpu_health.__file__).parents[2] / "sandbox"))
import nvidia_smi  # noqa: E402  (the sandbox's stand-in, a script)


@pytest.fixture(autouse=True)
def _restore_conf(monkeypatch):
    monkeypatch.setattr(nvidia_smi, "conf", nvidia_smi.conf)


def rows_of(capsys, **knobs):
    nvidia_smi.conf = lambda: dict(nvidia_smi.DEFAULT, **knobs)
    assert nvidia_smi.main(["--query-gpu=" + ",".join(FIELDS), "--format=csv,noheader,nounits"]) == 0
    return parse_rows(capsys.readouterr().out)


def lines(findings):
    return [f["line"] for f in findings]


def test_a_healthy_host_has_nothing_to_say(capsys):
    rows = rows_of(capsys)
    assert len(rows) == 8 and rows[3]["pci.bus_id"] == "00000000:1B:00.0"
    assert judge(rows, []) == ([], [])


@pytest.mark.parametrize("knobs,expect", [
    ({"reset_required": [5]}, "GPU 5: the driver says the GPU needs a reset (reset_status.reset_required: Yes): "
                              "nvidia-smi -r -i 5 with nothing running on it, else reboot"),
    ({"remapped_rows_pending": [2]}, "GPU 2: a memory row remapping is pending (remapped_rows.pending: Yes): reset "
                                     "the GPU (nvidia-smi -r -i 2): the remapping applies then"),
    ({"remapped_rows_failure": [2], "remapped_rows_pending": [2]},
     "GPU 2: memory rows could not be remapped (remapped_rows.failure: Yes): the GPU needs service"),
    ({"ecc_uncorrected": {"4": 3}}, "GPU 4: uncorrected ECC errors since the driver loaded "
                                    "(ecc.errors.uncorrected.volatile.total: 3): reset the GPU"),
    ({"temperature_c": {"1": 93}}, "GPU 1: the GPU is at 93 C before the load (temperature.gpu: 93 C (refused from "
                                   "90 C"),
])
def test_each_field_refusal_names_the_gpu_the_evidence_and_what_to_do(capsys, knobs, expect):
    refuse, warn = judge(rows_of(capsys, **knobs), [])
    assert len(refuse) == 1 and lines(refuse)[0].startswith(expect) and warn == [], (refuse, warn)


def test_xid_lines_are_mapped_to_their_gpu_and_judged_by_number(capsys):
    rows = rows_of(capsys)
    events = xid_events([
        "NVRM: Xid (PCI:0000:1b:00): 79, pid=4242, name=python3, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:1b:00): 79, pid=4242, name=python3, GPU has fallen off the bus.",   # once is enough
        "NVRM: Xid (PCI:0000:19:00): 13, pid=1, name=python3, Graphics SM Warp Exception",      # an app's own fault
        "NVRM: Xid (PCI:0000:1d:00): 119, pid=7, name=VLLM::Worker_TP5, Timeout after 6s of waiting for RPC",
        "NVRM: Xid (PCI:0000:1e:00): 999, pid=7, name=x, a number nobody knows yet",
        "NVRM: Xid (PCI:0000:af:00): 79, pid=7, name=x, GPU has fallen off the bus.",    # no longer listed at all
        "usb 1-1: new high-speed USB device",
    ])
    refuse, warn = judge(rows, events)
    assert lines(refuse) == [
        "GPU 3: the GPU fell off the bus (Xid 79 at PCI 0000:1b:00 since boot: pid=4242, name=python3, GPU has "
        "fallen off the bus.): reboot the host; if it comes back, reseat the card and check its power",
        "GPU 5: a GSP RPC timeout (the GPU's firmware stopped answering) (Xid 119 at PCI 0000:1d:00 since boot: "
        "pid=7, name=VLLM::Worker_TP5, Timeout after 6s of waiting for RPC): reset the GPU, else reboot the host",
        "a GPU nvidia-smi does not list: the GPU fell off the bus (Xid 79 at PCI 0000:af:00 since boot: pid=7, "
        "name=x, GPU has fallen off the bus.): reboot the host; if it comes back, reseat the card and check its power",
    ]
    assert lines(warn) == ["GPU 6: Xid 999 (Xid 999 at PCI 0000:1e:00 since boot: pid=7, name=x, a number nobody "
                           "knows yet): look it up in NVIDIA's Xid catalog"]


def test_what_only_slows_the_load_is_a_warning(capsys):
    refuse, warn = judge(rows_of(capsys, pcie_width={"6": 8}, thermal_slowdown=[0]), [])
    assert refuse == [] and lines(warn) == [
        "GPU 0: clocks held down: hw_thermal_slowdown (hw_thermal_slowdown Active): check cooling and power",
        "GPU 6: PCIe link x8 of x16 (pcie.link.width.current 8, pcie.link.width.max 16): reseat the card: weights "
        "and NCCL ride this link"]


def test_what_the_driver_does_not_know_or_report_is_not_judged():
    rows = parse_rows("0, 00000000:18:00.0, [N/A], [N/A], [Not Supported], [N/A], 16, 16, 5, 5, [N/A], [N/A], "
                      "[N/A], [N/A], [N/A]")
    assert rows[0]["temperature.gpu"] is None and judge(rows, []) == ([], [])
    assert pci_key("00000000:1B:00.0") == pci_key("0000:1b:00") == "0000:1b:00"


def test_the_sandbox_nvidia_smi_refuses_a_field_it_does_not_know_as_the_real_one(capsys):
    nvidia_smi.conf = lambda: dict(nvidia_smi.DEFAULT)
    assert nvidia_smi.main(["--query-gpu=index,no.such.field", "--format=csv"]) == 2
    assert capsys.readouterr().out == 'Field "no.such.field" is not a valid field to query.\n'


def test_the_gate_before_every_start_refuses_a_dead_gpu_stops_the_unit_and_is_the_runs_root_cause(monkeypatch,
                                                                                                  capsys):
    """The unit's drop-in runs roles/render/files/gpu_gate/gpu_gate.py (ExecStartPre=+) before every start systemd
    makes: a GPU that logged Xid 79 while serving stops the crash loop instead of being restarted into."""
    import importlib.util

    from deployer.host.module_utils import root_causes
    sys.modules.setdefault("ansible.module_utils.gpu_health", gpu_health)
    path = Path(gpu_health.__file__).parents[3] / "roles/render/files/gpu_gate/gpu_gate.py"
    spec = importlib.util.spec_from_file_location("gpu_gate", path)
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    ran = []
    monkeypatch.setattr(gate.subprocess, "run", lambda argv, **kw: ran.append(argv))
    monkeypatch.setattr(gate, "read", lambda since: (rows_of(capsys), [], []))
    assert gate.main(["--service", "deployer-engine"]) == 0 and ran == []
    events = xid_events(["NVRM: Xid (PCI:0000:1b:00): 79, pid=1, name=VLLM::Worker_TP3, GPU has fallen off the bus."])
    seen = []
    monkeypatch.setattr(gate, "read", lambda since: (seen.append(since) or rows_of(capsys), events, []))
    assert gate.main(["--service", "deployer-engine", "--since-epoch", "1796670000"]) == 1 and seen == [1796670000]
    assert ran == [["systemctl", "--no-block", "stop", "deployer-engine.service"]]
    out = capsys.readouterr().out.splitlines()
    assert out == ["deployer GPU gate: refused to start deployer-engine: GPU 3: the GPU fell off the bus (Xid 79 at "
                   "PCI 0000:1b:00 since boot: pid=1, name=VLLM::Worker_TP3, GPU has fallen off the bus.): reboot "
                   "the host; if it comes back, reseat the card and check its power"]
    kind, line = root_causes.root_cause(["INFO 12-07 Starting vLLM API server", *out])
    assert kind == "gpu_unhealthy" and "GPU 3: the GPU fell off the bus" in line
    assert "stopped instead of restarted" in root_causes.advice(kind, line)
