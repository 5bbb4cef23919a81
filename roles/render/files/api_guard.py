"""The deployer's API guard: what a vLLM server answers, to anyone, is only what a client needs.

vLLM checks its API key only on paths that begin with ``/v1`` (``AuthenticationMiddleware`` in
vllm/entrypoints/openai/server_utils.py, every supported release), so with a key set ``/invocations`` (the same
inference, SageMaker's route), ``/tokenize``, ``/detokenize``, ``/score``, ``/pooling``, ``/classify``, ``/rerank``,
``/pause``, ``/resume``, ``/scale_elastic_ep`` ... answer without one.  This middleware is loaded by vLLM's own
``--middleware`` (vllm/entrypoints/openai/api_server.py ``build_app``: ``app.add_middleware(<class>)``, around every
route the app has, the SageMaker ones included) and lets through:

  * ``/v1`` and ``/v1/...`` with the key (``Authorization: Bearer <key>``; CORS preflights, OPTIONS, without it,
    as vLLM does), or without one when the server has no key;
  * ``/health`` and ``/metrics`` without a key (what a balancer and Prometheus read);

and answers everything else 403 (a WebSocket is closed with 1008).  The key is the one vLLM reads
(``VLLM_API_KEY``, from the live 0600 secrets file); it is compared by sha256 digest in constant time, as vLLM does.
docs/security.md argues the choice.  Shipped by the render stage to ``<root>/bin/deployer_api_guard_<sha>.py``
(root's, named by its content: a release keeps the guard it was rendered with).  Standard library only: it runs
inside the engine's process, whatever its Python packages.
"""
import hashlib
import hmac
import os

PUBLIC_PATHS = ("/health", "/metrics", "/metrics/")
KEYED_PREFIX = "/v1"
_FORBIDDEN = b'{"error": "Forbidden: this server answers /v1 (with its API key), /health and /metrics only"}'
_UNAUTHORIZED = b'{"error": "Unauthorized"}'


def route_path(scope):
    """The path the app routes on: ``scope["path"]`` less ``root_path`` (starlette.routing.get_route_path)."""
    path, root = scope.get("path") or "", scope.get("root_path") or ""
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root):] or "/"
    return path


def bearer(headers):
    """The token of the request's ``Authorization: Bearer <token>`` header (None when there is none)."""
    for name, value in headers or ():
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token if scheme.lower() == "bearer" else None
    return None


def decide(method, path, token, key_digests):
    """None: the request goes on to the engine; else the HTTP status that refuses it (403 or 401)."""
    if path in PUBLIC_PATHS:
        return None
    if path == KEYED_PREFIX or path.startswith(KEYED_PREFIX + "/"):
        if not key_digests or method == "OPTIONS":
            return None
        got = hashlib.sha256((token or "").encode("utf-8")).digest() if token is not None else b""
        ok = False
        for want in key_digests:
            ok |= hmac.compare_digest(got, want)
        return None if ok else 401
    return 403


class ApiGuard:
    """Pure ASGI middleware (no Starlette import): ``ApiGuard(app)``, as vLLM's ``--middleware`` constructs it."""

    def __init__(self, app, keys=None):
        self.app = app
        if keys is None:
            keys = [k for k in (os.environ.get("VLLM_API_KEY", ""),) if k]
        self.key_digests = [hashlib.sha256(k.encode("utf-8")).digest() for k in keys]

    async def __call__(self, scope, receive, send):
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            return await self.app(scope, receive, send)       # lifespan
        status = decide(scope.get("method", "GET"), route_path(scope), bearer(scope.get("headers")),
                        self.key_digests)
        if status is None:
            return await self.app(scope, receive, send)
        if kind == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = _UNAUTHORIZED if status == 401 else _FORBIDDEN
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
