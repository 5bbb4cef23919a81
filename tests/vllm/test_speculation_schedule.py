"""deployer_speculation_max_batch_size reaches vLLM as its own per-batch-size schedule (num_speculative_tokens_per_
batch_size), read back through the release's own code from the wheels: k drafts up to N sequences in a step, none
above (issue 55); a release without the schedule has no such field, and vLLM's config forbids extra fields, so its
own check in the verify stage refuses it."""
import importlib.util
import json

import pytest

from deployer.engines import vllm_argv


def schedule(n, k=3):
    cfg = json.loads(vllm_argv.speculative_config("eagle3", "/d", k, {"rejection_sample_method": "x"}, n))
    return cfg.get(vllm_argv.SCHEDULE_KEY), cfg


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_the_schedule_is_vllms_own_k_up_to_n_and_none_above(vllm_src, version):
    path = vllm_src(version) / "v1/spec_decode/dynamic/utils.py"
    spec = importlib.util.spec_from_file_location("dynamic_sd_" + version.replace(".", "_"), path)
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    sched, cfg = schedule(8)
    assert cfg["rejection_sample_method"] == "x" and cfg["num_speculative_tokens"] == 3
    dense = utils.build_dynamic_sd_schedule_lookup(sched, 128, 3)     # max_num_seqs 128, k 3
    assert dense[1:9] == [3] * 8 and set(dense[9:]) == {0} and len(dense) == 129
    assert utils.build_dynamic_sd_schedule_lookup(schedule(1)[0], 4, 3)[1:] == [3, 0, 0, 0]


def test_a_release_without_the_schedule_has_no_such_field_and_zero_adds_nothing(vllm_src):
    assert vllm_argv.SCHEDULE_KEY not in (vllm_src("0.18.0") / "config/speculative.py").read_text()
    assert vllm_argv.SCHEDULE_KEY in (vllm_src("0.33.0") / "config/speculative.py").read_text()
    assert schedule(0)[0] is None                                      # 0: the argv as before (golden ids kept)
    for bad in (-1, True, 2.5):
        with pytest.raises(vllm_argv.ServeConfigError, match="speculation_max_batch_size"):
            schedule(bad)
    with pytest.raises(vllm_argv.ServeConfigError, match="keep one"):
        vllm_argv.speculative_config("eagle3", "/d", 3, {vllm_argv.SCHEDULE_KEY: [[1, 2, 3]]}, 8)
