"""A renamed unit (deployer_service_name changed, or its default: deployer-vllm -> deployer-engine) is found and
retired, never left running beside the new one (module_utils/host_io.deployer_units, release_start's retire)."""
from deployer.host.module_utils.host_io import deployer_units

UNIT = "[Service]\nEnvironmentFile=/opt/deployer/releases/0123456789ab/vllm.env\nExecStart=/x\n"


def test_the_units_of_this_root_are_found_by_their_release_environment_file(tmp_path):
    (tmp_path / "deployer-vllm.service").write_text(UNIT)
    (tmp_path / "deployer-engine.service").write_text(UNIT.replace("0123456789ab", "ba9876543210"))
    (tmp_path / "other.service").write_text("[Service]\nEnvironmentFile=/etc/default/other\n")
    (tmp_path / "elsewhere.service").write_text(UNIT.replace("/opt/deployer/", "/srv/deployer2/"))
    (tmp_path / "alias.service").symlink_to(tmp_path / "deployer-vllm.service")   # an alias is not a unit of its own
    (tmp_path / "deployer-vllm.service.d").mkdir()
    assert deployer_units("/opt/deployer/", str(tmp_path)) == ["deployer-engine", "deployer-vllm"]
    assert deployer_units("/opt/deployer", str(tmp_path / "none")) == []
