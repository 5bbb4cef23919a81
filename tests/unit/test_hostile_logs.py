"""The service user writes the journal the watch reads as root: no line it can print makes the watch (or
`deployer status`'s last fatal line) slow, and the watch's result stays bounded (issue 40, F2).  The bounds are
complexity guards (seconds, not milliseconds, so that a busy CI machine never fails them): the old prefix regex
took ~17 s for one 16 KB line."""
import time

from deployer.host.module_utils import engine_logs, log_lines, root_causes

HOSTILE = ["(" + "a" * 16000, "(" + "a" * 47000 + " ", "(Worker_TP0 pid=1) " * 2000]


def test_hostile_lines_cost_the_watch_and_status_almost_nothing():
    t0 = time.monotonic()
    st = engine_logs.LoadState()
    for i, line in enumerate(HOSTILE):
        st.feed(line, float(i))
    root_causes.root_cause(HOSTILE)
    assert time.monotonic() - t0 < 1.0
    assert st.phase == "starting" and st.fatal is None


def test_the_real_prefixes_are_still_stripped():
    assert log_lines.strip_prefix("(EngineCore_DP0 pid=8) (Worker_TP1 pid=9) INFO 12-04 10:00:01 [gpu.py:12] Loading") \
        == "Loading"
    assert log_lines.strip_prefix("(APIServer pid=1) ERROR 12-04 10:00:01.123 [api.py:3] boom") == "boom"


def test_a_long_fatal_line_is_kept_capped():
    st = engine_logs.LoadState()
    st.feed("torch.OutOfMemoryError: CUDA out of memory " + "x" * 100000, 1.0)
    assert st.fatal[0] == "cuda_oom" and len(st.fatal[1]) <= log_lines.LINE_CHARS


def test_warnings_are_capped():
    st = engine_logs.LoadState()
    t0 = time.monotonic()
    for i in range(20000):
        st.feed("Using AttentionBackendEnum.X%d backend" % i, float(i))
    assert len(st.snapshot()["warnings"]) == engine_logs.MAX_WARNINGS
    assert time.monotonic() - t0 < 5.0


# SGLang 0.5.23 logs its whole configuration at start-up, the API key in it (srt/entrypoints/engine.py:
# logger.info(f"server_args={_server_args_for_logging(server_args)}"), a dict of ServerArgs.resolved_dict() that
# redacts only the watermark secrets): the shapes a key takes in a line an engine prints.
KEY = "sk-live-S3CRET'x\"y"
KEY_LINES = [
    "[2026-12-04 10:00:00] server_args={'model_path': '/m', 'api_key': 'sk-live-S3CRET\\'x\"y', "
    "'admin_api_key': \"sk-live-S3CRET'x\\\"y\", 'port': 30000}",
    "server_args=ServerArgs(model_path='/m', api_key='sk-live-S3CRET\\'x\"y', port=30000)",
    "{\"api_key\": \"sk-live-S3CRET'x\\\"y\", \"hf_token\": \"hf_S3CRETtok\"}",
    "launch: python -m sglang.launch_server --api-key sk-live-S3CRET --admin-api-key=sk-live-S3CRET --port 1",
    # issue 53 N6: what an environment dump, a crash reporter, a --config merge error or request logging print
    "VLLM_API_KEY=sk-live-S3CRET HF_TOKEN=hf_S3CRET HUGGING_FACE_HUB_TOKEN=hf_S3CRET WANDB_API_KEY=S3CRET",
    "os.environ: environ({'PATH': '/usr/bin', 'VLLM_API_KEY': 'sk-live-S3CRET', 'HF_TOKEN': 'hf_S3CRET'})",
    "API_KEY=S3CRET apiKey=S3CRET api-key: S3CRET db_password: S3CRET",
    "argv: ['vllm', 'serve', '/m', '--api-key', 'sk-live-S3CRET', '--port', '1']",
    "127.0.0.1 - headers: Authorization: Bearer sk-live-S3CRET; authorization: basic S3CRETb64",
    "server_args: {'api_key': ['sk-live-S3CRET1', 'sk-live-S3CRET2'], 'port': 1}",
    "api_key=ab,S3CRET port=1",
]


def _secret_free(text):
    return "S3CRET" not in text


def test_an_api_key_an_engine_logs_is_redacted_in_what_the_watch_and_status_read():
    import json
    for line in KEY_LINES:
        assert _secret_free(log_lines.redact(line)), line
        e = log_lines.journal_entry(json.dumps({"MESSAGE": line}))
        assert _secret_free(e["MESSAGE"]), e["MESSAGE"]
        e = log_lines.journal_entry(json.dumps({"MESSAGE": list(line.encode())}))
        assert _secret_free(e["MESSAGE"])
    assert log_lines.redact("api_key=None, port=1") == "api_key=None, port=1"      # nothing to hide: shown as is
    assert "'port': 30000" in log_lines.redact(KEY_LINES[0]) and "model_path='/m'" in log_lines.redact(KEY_LINES[1])
    # what is not a secret stays as written: token counts, the other flags
    for line in ("max_tokens=16 max_num_batched_tokens=8192 --max-tokens 5", "'PATH': '/usr/bin'", "--port 1"):
        assert log_lines.redact(line) == line


def test_the_line_wrapper_redacts_before_the_journal():
    """The wrapper (the unit's main process) sees every line first: what it writes to journald holds no key,
    so `journalctl -u` (adm, systemd-journal) shows none either."""
    import importlib.util

    from helpers import ROOT
    spec = importlib.util.spec_from_file_location("journal_lines", ROOT / "roles/render/files/journal_lines.py")
    jl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jl)
    lines, rest = jl.split("\n".join(KEY_LINES).encode() + b"\n")
    assert rest == b"" and len(lines) == len(KEY_LINES)
    for out in lines:
        assert _secret_free(out.decode()), out
    assert [log_lines.redact(x) for x in KEY_LINES] == [x.decode() for x in lines]   # one rule in both places
    assert jl._SECRET_SETTING.pattern == log_lines.SECRET_SETTING.encode()
