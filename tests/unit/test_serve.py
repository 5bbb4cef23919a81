"""The vllm serve argv (built in one place) and systemd quoting."""
import json
import re

import pytest

from deployer.engines.argv import ServeConfigError, exec_start, systemd_env_quote, systemd_exec_quote
from deployer.engines.vllm_argv import build_serve_argv

BASE = dict(launcher=["/opt/deployer/venvs/vllm-0.16.0/bin/vllm"], model="/srv/models/Kimi-K2.5",
            served_model_name="kimi-k2.5", host="0.0.0.0", port=8000, tensor_parallel_size=8,
            gpu_memory_utilization=0.9, max_model_len=131072, trust_remote_code=True,
            speculative={"method": "eagle3", "model": "/opt/deployer/drafters/abc", "num_speculative_tokens": 3},
            extra_args=[])

GOLDEN = [
    "/opt/deployer/venvs/vllm-0.16.0/bin/vllm", "serve", "/srv/models/Kimi-K2.5",
    "--served-model-name", "kimi-k2.5", "--host", "0.0.0.0", "--port", "8000",
    "--tensor-parallel-size", "8", "--gpu-memory-utilization", "0.9", "--max-model-len", "131072",
    "--trust-remote-code",
    "--speculative-config", '{"method":"eagle3","model":"/opt/deployer/drafters/abc","num_speculative_tokens":3}',
]


def test_golden_argv():
    assert build_serve_argv(BASE) == GOLDEN


def test_speculative_json_is_stable_and_parseable():
    a = build_serve_argv(dict(BASE, speculative=dict(BASE["speculative"], extra={"kv_cache_dtype": "auto"})))
    cfg = json.loads(a[a.index("--speculative-config") + 1])
    assert cfg == {"method": "eagle3", "model": "/opt/deployer/drafters/abc", "num_speculative_tokens": 3,
                   "kv_cache_dtype": "auto"}
    # the exact bytes, compact and keys sorted (issue 24 item 9: this compared the function's output with itself):
    # equal configs render byte-identical whatever order the operator's extra keys came in, so a re-run renders
    # the same release id
    want = ('{"kv_cache_dtype":"auto","method":"eagle3","model":"/opt/deployer/drafters/abc",'
            '"num_speculative_tokens":3,"quantization":"fp8"}')
    for extra in ({"quantization": "fp8", "kv_cache_dtype": "auto"}, {"kv_cache_dtype": "auto", "quantization": "fp8"}):
        b = build_serve_argv(dict(BASE, speculative=dict(BASE["speculative"], extra=extra)))
        assert b[b.index("--speculative-config") + 1] == want


def test_no_speculation():
    a = build_serve_argv(dict(BASE, speculative={}))
    assert "--speculative-config" not in a


@pytest.mark.parametrize("field,value,needle", [
    ("port", 70000, "port: got 70000, expected an integer 1..65535"),
    ("tensor_parallel_size", 0, "tensor_parallel_size: got 0"),
    ("gpu_memory_utilization", 1.5, "gpu_memory_utilization: got 1.5, expected a number in (0, 1]"),
    ("model", "relative/path", "expected an absolute path"),
    ("served_model_name", "bad name", "served_model_name"),
    ("extra_args", "--foo bar", "expected a list of strings"),
    ("extra_args", ["--port", "9000"], "--port is set by the deployer"),
    # vLLM's parser keeps argparse's allow_abbrev: --max-model 1000 would BE --max-model-len 1000
    ("extra_args", ["--max-model", "1000"], "--max-model abbreviates --max-model-len, which is set by the deployer"),
    ("extra_args", ["--speculative_conf={}"], "--speculative-conf abbreviates --speculative-config"),
    ("extra_args", ["--api-key=abc"], "secret env file"),
    ("speculative", {"method": "eagle", "model": "/d", "num_speculative_tokens": 3}, "speculative method"),
    ("speculative", {"method": "eagle3", "model": "/d", "num_speculative_tokens": 0}, "num_speculative_tokens"),
])
def test_bad_input_names_measured_and_expected(field, value, needle):
    with pytest.raises(ServeConfigError) as e:
        build_serve_argv(dict(BASE, **{field: value}))
    assert needle in str(e.value)


def _systemd_split(line):
    """Reference parser for ExecStart words (systemd.service(5)): quotes, C escapes, $$ and %%."""
    words, cur, i, q, started = [], "", 0, None, False
    while i < len(line):
        c = line[i]
        if q:
            if c == "\\":
                cur += line[i + 1]; i += 2; continue
            if c == q:
                q = None; i += 1; continue
            cur += c
        elif c in "\"'":
            q, started = c, True
        elif c == " ":
            if started or cur:
                words.append(cur); cur, started = "", False
        else:
            cur += c; started = True
        i += 1
    if started or cur:
        words.append(cur)
    return [_unescape_expansions(w) for w in words]


def _unescape_expansions(word):
    """``$$`` -> ``$`` and ``%%`` -> ``%``; what systemd would expand instead is an error here, so a writer that
    stops escaping fails (mutant F2: a lenient ``replace`` took a lone ``$`` and ``%`` as literal)."""
    out, i = "", 0
    while i < len(word):
        c, nxt = word[i], word[i + 1:i + 2]
        if c in "$%" and nxt == c:
            out, i = out + c, i + 2
            continue
        if c == "%" or (c == "$" and (nxt == "{" or nxt.isalnum() or nxt == "_")):
            raise ValueError(f"systemd would expand {word[i:i + 2]!r} in {word!r}")
        out, i = out + c, i + 1
    return out


@pytest.mark.parametrize("word", ["plain", "with space", "quote\"d", "it's", "semi;colon", "$(touch /tmp/x)",
                                  "back\\slash", "100%", "${HOME}", "`id`"])
def test_exec_quote_roundtrip(word):
    assert _systemd_split(systemd_exec_quote(word)) == [word]
    assert _systemd_split(exec_start(["/bin/x", word, "y"])) == ["/bin/x", word, "y"]


def test_newlines_refused():
    with pytest.raises(ServeConfigError):
        systemd_exec_quote("a\nb")
    with pytest.raises(ServeConfigError):
        systemd_env_quote("a\nb")


def test_env_quote_escapes_dollar_and_quotes():
    assert systemd_env_quote('p"a$s`s\\') == '"p\\"a\\$s\\`s\\\\"'


def test_load_knobs_reach_the_argv_and_bad_ones_are_refused():
    argv = build_serve_argv(dict(BASE, safetensors_load_strategy="eager",
                                 model_loader_extra_config={"num_threads": 16, "enable_multithread_load": True}))
    assert argv[argv.index("--safetensors-load-strategy") + 1] == "eager"
    assert argv[argv.index("--model-loader-extra-config") + 1] == '{"enable_multithread_load":true,"num_threads":16}'
    assert "--safetensors-load-strategy" not in build_serve_argv(dict(BASE))     # "" = vLLM's own default
    for bad, needle in ((dict(safetensors_load_strategy="fast"), "safetensors_load_strategy: got 'fast'"),
                        (dict(model_loader_extra_config={"threads": 8}), "model_loader_extra_config: got threads=8"),
                        (dict(model_loader_extra_config={"num_threads": 0}), "num_threads=0"),
                        (dict(extra_args=["--safetensors-load-strategy", "eager"]), "set by the deployer")):
        with pytest.raises(ServeConfigError, match=re.escape(needle)):
            build_serve_argv(dict(BASE, **bad))
