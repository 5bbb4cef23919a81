"""The API guard (roles/render/files/api_guard.py, issue 53 N1): vLLM checks its key on /v1 only, so the deployer
loads a middleware that answers /v1 (with the key), /health and /metrics and refuses the rest.  What it decides,
that it is wired into every vLLM plan (argv, environment, the file the render stage ships), that the stand-in runs
it as vLLM's build_app does, and what `status` says is exposed.  The same on the real engine:
tests/integration/test_real_engine.py::test_a_cold_deploy_serves_kimi_k25_s_own_class_with_eagle3_and_accepts_drafts."""
import asyncio
import importlib.util
import json
import threading
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest
from test_render_golden import settings

from deployer import engines, identity
from deployer.plan import PlanError, make_plan
from helpers import ROOT

DRAFTER = {"src": "/d", "files": [], "tree_sha256": "ab" * 32, "bytes": 0}
spec = importlib.util.spec_from_file_location("api_guard", ROOT / "roles/render/files/api_guard.py")
guard = importlib.util.module_from_spec(spec)
spec.loader.exec_module(guard)
KEY = "k-" + "5" * 20


@pytest.mark.parametrize("method,path,token,key,want", [
    ("POST", "/invocations", None, KEY, 403), ("POST", "/invocations", KEY, KEY, 403),   # the key opens /v1 only
    ("POST", "/pause", None, KEY, 403), ("POST", "/resume", None, None, 403), ("POST", "/tokenize", KEY, KEY, 403),
    ("GET", "/version", None, KEY, 403), ("POST", "/scale_elastic_ep", None, KEY, 403), ("GET", "/", None, KEY, 403),
    ("GET", "/v1x/models", KEY, KEY, 403), ("GET", "/healthz", None, KEY, 403), ("GET", "//v1/models", KEY, KEY, 403),
    ("GET", "/health", None, KEY, None), ("GET", "/metrics", None, KEY, None), ("GET", "/metrics/", None, KEY, None),
    ("GET", "/v1/models", None, KEY, 401), ("GET", "/v1/models", "wrong", KEY, 401), ("GET", "/v1", "", KEY, 401),
    ("GET", "/v1/models", KEY, KEY, None), ("POST", "/v1/chat/completions", KEY, KEY, None),
    ("OPTIONS", "/v1/chat/completions", None, KEY, None),       # a CORS preflight carries no key (vLLM's rule)
    ("GET", "/v1/models", None, None, None),                     # no key on the server: /v1 is open, the rest is not
])
def test_the_guard_answers_v1_with_the_key_health_and_metrics_and_refuses_the_rest(method, path, token, key, want):
    digests = [guard.hashlib.sha256(key.encode()).digest()] if key else []
    assert guard.decide(method, path, token, digests) == want


def _call(mw, path, method="POST", headers=(), kind="http", root_path=""):
    passed, sent = [], []

    async def app(scope, receive, send):
        passed.append(scope["path"])

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(m):
        sent.append(m)
    scope = {"type": kind, "method": method, "path": path, "root_path": root_path,
             "headers": [(k.encode(), v.encode()) for k, v in headers]}
    asyncio.run(mw(app, keys=[KEY])(scope, receive, send))
    return passed, sent


def test_the_asgi_middleware_refuses_before_the_app_and_passes_the_rest_untouched():
    passed, sent = _call(guard.ApiGuard, "/invocations")
    assert not passed and sent[0]["status"] == 403 and b"Forbidden" in sent[1]["body"]
    passed, sent = _call(guard.ApiGuard, "/v1/models", "GET", [("Authorization", "Bearer " + KEY)])
    assert passed == ["/v1/models"] and not sent
    passed, sent = _call(guard.ApiGuard, "/v1/models", "GET", [("authorization", "bearer " + KEY)])   # any case
    assert passed and not sent
    passed, sent = _call(guard.ApiGuard, "/v1/models", "GET", [("Authorization", "Basic " + KEY)])
    assert not passed and sent[0]["status"] == 401
    # a websocket outside /v1 is closed before it is accepted (policy violation); the lifespan passes
    passed, sent = _call(guard.ApiGuard, "/pause", kind="websocket")
    assert not passed and sent == [{"type": "websocket.close", "code": 1008}]
    passed, sent = _call(guard.ApiGuard, "/", kind="lifespan")
    assert passed and not sent
    # routed as Starlette routes: the path less root_path (a proxy's prefix)
    passed, sent = _call(guard.ApiGuard, "/api/pause", root_path="/api")
    assert not passed and sent[0]["status"] == 403


def test_the_key_is_the_one_vllm_reads(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    g = guard.ApiGuard(app=None)
    assert g.key_digests == [guard.hashlib.sha256(KEY.encode()).digest()]
    monkeypatch.delenv("VLLM_API_KEY")
    assert guard.ApiGuard(app=None).key_digests == []


def _standin(middleware=()):
    from deployer.sandbox import vllm_standin
    metrics = vllm_standin.Metrics("kimi", 3, 0.6, True)
    handler = vllm_standin.VllmApi.make(knobs={}, metrics=metrics, api_key=KEY, model_name="kimi", model_root="/m",
                                        started=1.0, middleware=tuple(middleware))
    handler.log_message = lambda *a: None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _status(srv, path, method="POST", key=None):
    body = json.dumps({"model": "kimi", "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{srv.server_port}{path}", method=method,
                                 data=body if method == "POST" else None,
                                 headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_standin_answers_what_vllm_answers_and_runs_the_guard_as_build_app_does():
    # vLLM's own behaviour, which the guard exists for: /invocations and /pause answer without the key
    srv = _standin()
    try:
        assert (_status(srv, "/invocations"), _status(srv, "/pause"), _status(srv, "/v1/models", "GET")) == \
            (200, 200, 401)
    finally:
        srv.shutdown()
    srv = _standin([guard.ApiGuard])
    try:
        assert _status(srv, "/invocations") == 403 and _status(srv, "/pause") == 403
        assert _status(srv, "/v1/models", "GET") == 401 and _status(srv, "/v1/models", "GET", KEY) == 200
        assert _status(srv, "/v1/chat/completions", key=KEY) == 200 and _status(srv, "/health", "GET") == 200
        assert _status(srv, "/metrics", "GET") == 200
    finally:
        srv.shutdown()


def test_every_vllm_plan_loads_the_guard_shipped_by_its_content():
    p = make_plan(settings(), DRAFTER)
    path, module = identity.api_guard_module("/opt/deployer/bin")
    assert p["argv"][p["argv"].index("--middleware") + 1] == f"{module}.ApiGuard"
    assert p["unit"]["api_guard"] == path and p["env"]["PYTHONPATH"] == "/opt/deployer/bin"
    assert p["api_exposure"].endswith("every other path refused (API guard)"), p["api_exposure"]
    # an operator's own --middleware or PYTHONPATH would take the guard away: refused before anything changes
    with pytest.raises(PlanError, match="--middleware"):
        make_plan(settings(extra_args=["--middleware", "x.Y"]), DRAFTER)
    with pytest.raises(PlanError, match="PYTHONPATH is the deployer's"):
        make_plan(settings(env_extra={"PYTHONPATH": "/tmp"}), DRAFTER)
    # SGLang checks its key on every path itself: no guard, and status says what its own check leaves open
    s = make_plan(settings(backend="sglang", api_key="k"), DRAFTER)
    assert "--middleware" not in s["argv"] and s["unit"]["api_guard"] is None
    assert s["api_exposure"] == ("every path (its admin routes too) with the API key; without one: /health*, "
                                 "/ready*, /metrics* (SGLang's own check)")


def test_status_says_what_a_release_exposes_old_and_new():
    from deployer.cli.views import _api, _exposure
    new = make_plan(settings(api_key="k", host="0.0.0.0"), DRAFTER)
    rec = {"backend": "vllm", "argv": new["argv"], "api_protected": True}
    assert _exposure(rec) == (new["api_exposure"], True) and _api(rec) == "key+guard"
    # a release rendered before the guard: the key guards /v1 only, and status says so in red
    old = {"backend": "vllm", "argv": [a for a in new["argv"] if "api_guard" not in a and a != "--middleware"],
           "api_protected": True}
    text, closed = _exposure(old)
    assert not closed and "/invocations" in text and "/pause" in text and "red" in _api(old)
    # the live secrets decide whether a key is asked (a key taken away after the release was recorded)
    assert _exposure(rec, keyed=False)[1] is False
    assert engines.get("vllm").guarded(new["argv"]) and not engines.get("vllm").guarded(old["argv"])
