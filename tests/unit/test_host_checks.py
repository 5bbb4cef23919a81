"""What preflight says of a host's kernel setup before the load (deployer/host_checks.py)."""
from deployer.host_checks import missing_nodes, p2p_risks

SYS = {"NCCL_P2P_LEVEL": "SYS", "NCCL_IB_DISABLE": "1"}     # the deployer's default deployer_nccl_env


def test_missing_device_nodes_are_named():
    nodes = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"] + [f"nvidia{i}" for i in range(8)]
    assert missing_nodes(nodes, 8) == []
    assert missing_nodes([n for n in nodes if n not in ("nvidia-uvm", "nvidia7")], 8) == ["/dev/nvidia-uvm",
                                                                                          "/dev/nvidia7"]


def test_p2p_through_a_translating_iommu_is_warned_with_what_to_change():
    w = p2p_risks({"devices": 2, "cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet", "uvm_disable_hmm": "1"},
                  SYS)
    assert len(w) == 1 and "measured 2 IOMMU devices" in w[0] and "NCCL_P2P_LEVEL=SYS" in w[0]
    assert "iommu=pt" in w[0] and "NCCL_P2P_DISABLE: '1'" in w[0]


def test_passthrough_off_or_p2p_disabled_is_quiet():
    for cmdline in ("ro amd_iommu=on iommu=pt", "ro iommu=off", "ro amd_iommu=off quiet", "intel_iommu=off"):
        assert p2p_risks({"devices": 2, "cmdline": cmdline}, SYS) == [], cmdline
    assert p2p_risks({"devices": 2, "cmdline": "ro"}, dict(SYS, NCCL_P2P_DISABLE="1")) == []
    assert p2p_risks({"devices": 0, "cmdline": "ro"}, SYS) == []
    # a parameter that only looks alike is not passthrough
    assert p2p_risks({"devices": 1, "cmdline": "ro xiommu=pt"}, SYS)


def test_uvm_hmm_on_is_warned_and_an_unloaded_module_is_not():
    assert "uvm_disable_hmm=N" in p2p_risks({"devices": 0, "uvm_disable_hmm": "N"}, SYS)[0]
    assert p2p_risks({"devices": 0, "uvm_disable_hmm": "1"}, SYS) == []
    assert p2p_risks({"devices": 0, "uvm_disable_hmm": None}, SYS) == []


def _config(port=None, acs=None, size=4096):
    """A device's configuration space as sysfs gives it to root: the PCI Express capability (its port type) in the
    standard list at 0x40, and from 0x100 AER then ACS (its control register at +6), as PCIe lays them out."""
    c = bytearray(size)
    c[0:2], c[6:8] = (0x10B5).to_bytes(2, "little"), (0x0010).to_bytes(2, "little")   # a PLX vendor id; cap list
    if size >= 0x44:
        c[0x34] = 0x40
        c[0x40], c[0x41] = 0x10, 0                                       # PCI Express capability, last in the list
        c[0x42:0x44] = ((port or 0) << 4 | 2).to_bytes(2, "little")
    if size > 0x150:
        c[0x100:0x104] = (0x0001 | 1 << 16 | 0x148 << 20).to_bytes(4, "little")    # AER, next 0x148
        if acs is not None:
            c[0x148:0x14C] = (0x000D | 1 << 16).to_bytes(4, "little")            # ACS, the last
            c[0x14E:0x150] = acs.to_bytes(2, "little")
    return bytes(c)


def _sysfs(tmp_path, tree):
    """tree: {path of addresses from the root port down: (vendor, class, config)} -> /sys/bus/pci/devices."""
    devices = tmp_path / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    for chain, (vendor, cls, config) in tree.items():
        d = tmp_path / "devices" / "pci0000:00"
        for addr in chain.split("/"):
            d = d / addr
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
        (d / "config").write_bytes(config)
        (devices / chain.split("/")[-1]).symlink_to(d)
    return str(devices)


def test_pcie_acs_that_redirects_peer_to_peer_above_the_gpus_is_said_with_the_bridges_and_what_to_change(tmp_path):
    from deployer.host.module_utils import pci_acs
    redirect = 0x001D          # lspci: ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+
    devices = _sysfs(tmp_path, {
        "0000:00:01.1": ("0x1022", "0x060400", _config(port=0x4, acs=redirect)),
        "0000:00:01.1/0000:01:00.0": ("0x10b5", "0x060400", _config(port=0x5)),
        "0000:00:01.1/0000:01:00.0/0000:02:08.0": ("0x10b5", "0x060400", _config(port=0x6, acs=redirect)),
        "0000:00:01.1/0000:01:00.0/0000:02:10.0": ("0x10b5", "0x060400", _config(port=0x6, acs=0x0001)),
        "0000:00:01.1/0000:01:00.0/0000:02:08.0/0000:03:00.0": ("0x10de", "0x030200", _config()),
        "0000:00:01.1/0000:01:00.0/0000:02:10.0/0000:04:00.0": ("0x10de", "0x030000", _config()),
        "0000:00:01.1/0000:01:00.0/0000:02:10.0/0000:04:00.1": ("0x10de", "0x040300", _config()),   # its audio
    })
    rep = pci_acs.acs_report(devices)
    assert rep["gpus"] == 2 and rep["unreadable"] == []
    assert [(r["gpu"], r["bridge"], r["port"]) for r in rep["redirecting"]] == [
        ("0000:03:00.0", "0000:02:08.0", "switch downstream port"), ("0000:03:00.0", "0000:00:01.1", "root port"),
        ("0000:04:00.0", "0000:00:01.1", "root port")]
    assert rep["redirecting"][0]["flags"] == ["SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"]
    said = p2p_risks({"devices": 0, "cmdline": "ro", "acs": rep}, SYS)
    assert len(said) == 1 and "PCIe ACS redirects peer-to-peer on 2 bridge(s) above the GPUs" in said[0], said
    assert "0000:02:08.0 (switch downstream port: SrcValid ReqRedir CmpltRedir UpstreamFwd)" in said[0]
    assert "ECAP_ACS+0x6.w=0000" in said[0] and "through the IOMMU" not in said[0]
    assert "through the IOMMU that translates DMA here" in p2p_risks({"devices": 2, "cmdline": "ro", "acs": rep},
                                                                      SYS)[1]
    assert p2p_risks({"devices": 0, "acs": rep}, dict(SYS, NCCL_P2P_DISABLE="1")) == []


def test_pcie_acs_not_read_is_said_and_a_broken_capability_list_ends(tmp_path):
    from deployer.host.module_utils import pci_acs
    devices = _sysfs(tmp_path, {
        "0000:00:03.1": ("0x1022", "0x060400", _config(port=0x4, size=64)),        # not root: 64 bytes
        "0000:00:03.1/0000:05:00.0": ("0x10de", "0x030200", _config()),
    })
    rep = pci_acs.acs_report(devices)
    assert rep == {"gpus": 1, "redirecting": [], "unreadable": ["0000:00:03.1"]}
    assert "not measured on 1 bridge(s)" in p2p_risks({"devices": 0, "acs": rep}, SYS)[0]
    looped = bytearray(_config(port=0x4))
    looped[0x100:0x104] = (0x0001 | 1 << 16 | 0x100 << 20).to_bytes(4, "little")      # AER pointing at itself
    assert pci_acs.acs_control(bytes(looped)) is None and pci_acs.acs_control(b"") is None
    assert pci_acs.acs_report(str(tmp_path / "none")) == {"gpus": 0, "redirecting": [], "unreadable": []}


def _topo(n, bad=None):
    """`nvidia-smi topo -p2p r` as the driver prints it: a tab-separated matrix (a blank first cell), a legend."""
    bad = bad or {}
    rows = [" \t" + "\t".join(f"GPU{j}" for j in range(n)) + "\t"]
    for i in range(n):
        rows.append(f" GPU{i}\t" + "\t".join("X" if i == j else bad.get((i, j), bad.get((j, i), "OK"))
                                             for j in range(n)) + "\t")
    return "\n".join(rows) + "\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n  CNS  = Chipset not supported\n"


def test_topo_p2p_pairs_without_peer_reads_are_warned_and_ok_everywhere_is_quiet():
    from deployer.host_checks import p2p_matrix
    assert p2p_risks({"devices": 0, "topo_p2p": _topo(8)}, SYS) == []
    m = p2p_matrix(_topo(8, {(0, 4): "CNS", (3, 7): "GNS"}))
    assert len(m["pairs"]) == 28 and {k: v for k, v in m["pairs"].items() if v != "OK"} == {(0, 4): "CNS",
                                                                                             (3, 7): "GNS"}
    w = p2p_risks({"devices": 0, "topo_p2p": _topo(8, {(0, 4): "CNS", (3, 7): "GNS"})}, SYS)
    assert len(w) == 1 and "no peer-to-peer reads for 2 of 28 GPU pairs" in w[0], w
    assert "GPU0-GPU4 CNS, GPU3-GPU7 GNS" in w[0] and "CNS = Chipset not supported" in w[0]
    assert "slower all-reduce" in w[0] and "expected OK for every pair" in w[0]
    # P2P already off: NCCL never asks for it
    assert p2p_risks({"devices": 0, "topo_p2p": _topo(8, {(0, 4): "CNS"})}, dict(SYS, NCCL_P2P_DISABLE="1")) == []


def test_topo_p2p_is_read_as_data():
    from deployer.host_checks import p2p_matrix
    # one direction differs: both are shown; a cell outside the legend (markup, a terminal escape) becomes U
    m = p2p_matrix(_topo(2, {(0, 1): "OK"}).replace(" GPU1\tOK", " GPU1\t\x1b[31m[bold]"))
    assert m["pairs"] == {(0, 1): "OK/U"}
    w = p2p_risks({"devices": 0, "topo_p2p": _topo(2).replace(" GPU1\tOK", " GPU1\t[red]x")}, SYS)[0]
    assert "GPU0-GPU1 OK/U" in w and "[red]" not in w
    # no matrix (a driver that does not know -p2p, nvidia-smi failed: null), a ragged one: nothing judged
    for text in (None, "", "Invalid combination of input arguments.", _topo(3).replace("\tOK\t", "\t", 1)):
        assert p2p_matrix(text) is None and p2p_risks({"devices": 0, "topo_p2p": text}, SYS) == [], repr(text)
