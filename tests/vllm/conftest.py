import pytest

from vllm_wheels import extract


@pytest.fixture
def vllm_src(tmp_path):
    return lambda version: extract(version, tmp_path / version)
