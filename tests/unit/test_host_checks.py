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
