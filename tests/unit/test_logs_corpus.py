"""The load-phase parser and the status's root cause on failure logs shaped like real vLLM logs from public issues
(issue #12), not only on lines written from vLLM's source.  The formats (prefixes, headers, the order in which a
worker's failure and the engine's and API server's consequences arrive) follow these reports; pids, dates, paths and
sizes are ours:
  - vllm-project/vllm#28910, LMCache/LMCache#1998, vllm-project/vllm#45784: a worker fails to start, EngineCore
    reports "Exception: WorkerProc initialization failed due to an exception in a background process".
  - vllm-project/vllm#17939 (0.8.x): "(VllmWorker rank=1 pid=N)" prefixes; shutdown errors AFTER the root cause.
  - noonghunna/club-3090#58: CUDA OOM in EngineCore while serving, then EngineDeadError in the API server.
  - vllm-project/vllm#27508: the API server's "Engine core initialization failed. See root cause above."
Each case says what it guards."""
import pytest

from deployer.host.module_utils.engine_logs import LoadState
from deployer.host.module_utils.root_causes import root_cause


def worker_oom_at_startup():
    w, e, a = "(Worker_TP3 pid=812)", "(EngineCore_DP0 pid=700)", "(APIServer pid=1)"
    h = "ERROR 11-30 09:12:44"
    return [
        f"{w} INFO 11-30 09:12:01 [gpu_model_runner.py:2602] Starting to load model /srv/models/Kimi-K2.5...",
        f"{w} {h} [multiproc_executor.py:597] WorkerProc failed to start.",
        f"{w} {h} [multiproc_executor.py:597] Traceback (most recent call last):",
        f'{w} {h} [multiproc_executor.py:597]   File "/opt/v/lib/python3.12/site-packages/vllm/v1/executor/'
        'multiproc_executor.py", line 571, in worker_main',
        f"{w} {h} [multiproc_executor.py:597]     worker = WorkerProc(*args, **kwargs)",
        f"{w} {h} [multiproc_executor.py:597] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. "
        "GPU 3 has a total capacity of 94.97 GiB of which 1.02 GiB is free.",
        f"{e} ERROR 11-30 09:12:45 [core.py:708] EngineCore failed to start.",
        f"{e} ERROR 11-30 09:12:45 [core.py:708] Traceback (most recent call last):",
        f"{e} ERROR 11-30 09:12:45 [core.py:708]     raise e from None",
        f"{e} ERROR 11-30 09:12:45 [core.py:708] Exception: WorkerProc initialization failed due to an exception in "
        "a background process. See stack trace for root cause.",
        f"{e} Process EngineCore_DP0:",
        f"{e} Traceback (most recent call last):",
        f"{a} RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}",
    ]


def test_a_worker_oom_at_startup_is_named_as_the_oom_whatever_follows():
    # guards: the worker's OOM (specific) wins over EngineCore's and the API server's generic consequences,
    # both in the load watch and in the status's root cause
    st = LoadState()
    for i, line in enumerate(worker_oom_at_startup()):
        st.feed(line, float(i))
    assert st.fatal[0] == "cuda_oom" and st.fatal[1].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried")
    assert root_cause(worker_oom_at_startup()) == st.fatal


def test_a_non_specific_worker_failure_is_named_by_its_own_exception_not_by_the_engine_s_consequence():
    # guards: "WorkerProc failed to start." is generic; the worker's exception line names the failure, and
    # EngineCore's "Exception: WorkerProc initialization failed ..." that comes later does not replace it
    lines = [x.replace("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a total "
                       "capacity of 94.97 GiB of which 1.02 GiB is free.",
                       "RuntimeError: CUDA error: an illegal memory access was encountered")
             for x in worker_oom_at_startup()]
    assert root_cause(lines) == ("traceback", "RuntimeError: CUDA error: an illegal memory access was encountered")


def test_old_worker_prefixes_and_shutdown_errors_after_the_root_cause():
    # guards: 0.8.x's "(VllmWorker rank=N pid=M)" prefix is stripped; only the FIRST exception after a generic
    # line names the failure: the distributed shutdown error logged after it must not replace it
    w = "(VllmWorker rank=1 pid=2445156)"
    lines = [f"{w} ERROR 05-09 10:01:02 [multiproc_executor.py:470] WorkerProc failed to start.",
             f"{w} Traceback (most recent call last):",
             f"{w} ValueError: The model's max seq len (262144) is larger than the maximum number of tokens that can "
             "be stored in KV cache (131072).",
             f"{w} Traceback (most recent call last):",
             f"{w}     backend._shutdown()",
             f"{w} torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1.",
             "ERROR 05-09 10:01:03 [core.py:387] EngineCore failed to start."]
    assert root_cause(lines) == ("traceback", "ValueError: The model's max seq len (262144) is larger than the maximum "
                                              "number of tokens that can be stored in KV cache (131072).")


def test_an_oom_while_serving_then_engine_dead_in_the_api_server():
    # guards: the status's last fatal line reads past "ready" (the load watch does not)
    lines = ["(APIServer pid=1) INFO 11-30 09:30:00 [launcher.py:46] Application startup complete.",
             "(EngineCore pid=104) ERROR 11-30 10:02:11 [core.py:843] EngineCore encountered a fatal error.",
             "(EngineCore pid=104) Traceback (most recent call last):",
             "(EngineCore pid=104) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB.",
             "(APIServer pid=1) ERROR 11-30 10:02:11 [serving.py:1173] vllm.v1.engine.exceptions.EngineDeadError: "
             "EngineCore encountered an issue. See stack trace (above) for the root cause."]
    assert root_cause(lines) == ("cuda_oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB.")
    st = LoadState()
    for i, line in enumerate(lines):
        st.feed(line, float(i))
    assert st.phase == "ready" and st.fatal is None


@pytest.mark.parametrize("line", [
    "(Worker_TP0 pid=9) RuntimeError: CUDA error: out of memory",                  # the CUDA runtime's own wording
    "(Worker_TP0 pid=9) torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
    "(Worker_TP0 pid=9) ERROR 11-30 09:00:00 [gpu_worker.py:1] torch.OutOfMemoryError: CUDA out of memory.",
])
def test_other_wordings_of_cuda_oom(line):
    assert root_cause([line])[0] == "cuda_oom"


def test_nested_process_prefixes_are_stripped():
    # guards: a line behind two prefixes still feeds the phase rules and the anchored traceback rule
    st = LoadState()
    st.feed("(EngineCore_DP0 pid=9) (Worker_TP1 pid=12) INFO 11-30 10:00:00 [default_loader.py:291] "
            "Loading weights took 412.55 seconds", 1.0)
    assert st.facts["weights_seconds"] == 412.55
    assert root_cause(["(EngineCore_DP0 pid=9) (Worker_TP1 pid=12) Traceback (most recent call last):"]) == (
        "traceback", "Traceback (most recent call last):")
