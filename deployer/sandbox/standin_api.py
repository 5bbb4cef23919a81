"""SANDBOX ONLY: the HTTP API both engine stand-ins serve (vllm_standin.py plays vLLM, sglang_standin.py SGLang).

One handler for what a deployer reads of either engine's OpenAI-compatible server: uvicorn's server header and
access line, /health, /metrics, /v1/models (its card), /v1/chat/completions (the model-name check, the Bearer API
key: 401 as both engines answer it, the reply, its reasoning field), and the rehearsal knobs that change an answer
(chat_status, empty_reply, reply_text, reasoning_only).  Each stand-in subclasses it with its engine's words: the
names of its fields, the shape of its error bodies, its /health and its log.  Copied beside the stand-ins onto a
sandbox host (deployer/sandbox/image.py copies every ``*standin*.py``).  Standard library only.
"""
import asyncio
import json
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler


class ApiHandler(BaseHTTPRequestHandler):
    """The engine-neutral part.  A subclass sets the class attributes below (``make`` does) and overrides the hooks
    (``gate``, ``health``, ``error_body``, ``before_chat``, ``completed``, ``log_message``)."""
    server_version = "uvicorn"
    sys_version = ""
    api_key = ""
    knobs = {}
    metrics = None              # the stand-in's Metrics: .text(), .completion(prompt_tokens, gen_tokens, ttft), .spec
    model_name = ""             # --served-model-name, else the model path (what /v1/models lists)
    model_root = ""
    max_model_len = 262144
    owned_by = ""               # the engine's name in the model card
    card_extra = {}             # the engine's further card fields
    health_paths = ("/health",)
    reasoning_field = ""        # vLLM "reasoning", SGLang "reasoning_content"
    reply_words = ""            # the stand-in's reply starts with these
    reply_id = ""               # and its id
    started = 0.0
    middleware = ()             # ASGI middleware the engine loaded (vLLM's --middleware), in the order it added them
    open_posts = ()             # paths outside /v1 the engine answers without its key (vLLM: /invocations, /pause ...)

    @classmethod
    def make(cls, **attrs):
        return type(cls.__name__, (cls,), attrs)

    # ---------------------------------------------------------------- hooks
    def gate(self):
        """False when the request was answered already (a dead engine)."""
        return True

    def health(self):
        self._send(200)

    def error_body(self, code, message, kind):
        return {"error": {"message": message, "type": kind, "code": code}}

    def before_chat(self, req):
        """False when the request was answered already (a knob that kills the engine on it)."""
        return True

    def completed(self, prompt_tokens, gen_tokens, ttft_seconds):
        self.metrics.completion(prompt_tokens, gen_tokens, ttft_seconds)

    # ---------------------------------------------------------------- the common parts
    def log_request(self, code="-", size="-"):
        """uvicorn's access line: ``127.0.0.1:54321 - "GET /health HTTP/1.1" 200 OK`` (after the logger's prefix)."""
        try:
            phrase = " " + HTTPStatus(int(code)).phrase
        except ValueError:
            phrase = ""
        self.log_message('%s:%s - "%s" %s%s', self.client_address[0], self.client_address[1], self.requestline,
                         code, phrase)

    def _send(self, code, body=b"", ctype="application/json"):
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _through_middleware(self):
        """Run the request through the loaded ASGI middleware as Starlette does (the last added is the outermost):
        True when it reaches the routes, else the middleware's own answer is sent."""
        if not self.middleware:
            return True
        passed, sent = [], []

        async def routes(scope, receive, send):
            passed.append(True)

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        app = routes
        for cls in self.middleware:
            app = cls(app)
        path, _, query = self.path.partition("?")
        scope = {"type": "http", "method": self.command, "path": urllib.parse.unquote(path), "root_path": "",
                 "query_string": query.encode("latin-1"), "client": self.client_address[:2],
                 "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]}
        asyncio.run(app(scope, receive, send))
        if passed:
            return True
        start = next(m for m in sent if m["type"] == "http.response.start")
        self.send_response(start["status"])
        for k, v in start.get("headers", []):
            self.send_header(k.decode("latin-1"), v.decode("latin-1"))
        self.end_headers()
        self.wfile.write(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
        return False

    def _json(self, code, obj):
        self._send(code, json.dumps(obj).encode())

    def _authorized(self):
        if not self.api_key or self.headers.get("Authorization", "") == "Bearer " + self.api_key:
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    def do_GET(self):
        if not self.gate() or not self._through_middleware():
            return
        if self.path in self.health_paths:      # exempt from the API key, as /metrics
            return self.health()
        if self.path == "/metrics":
            return self._send(200, self.metrics.text().encode(), "text/plain; version=0.0.4; charset=utf-8")
        if self.path == "/v1/models":
            if not self._authorized():
                return
            card = dict({"id": self.model_name, "object": "model", "created": int(self.started or time.time()),
                         "owned_by": self.owned_by, "root": self.model_root, "max_model_len": self.max_model_len},
                        **self.card_extra)
            return self._json(200, {"object": "list", "data": [card]})
        self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        t0 = time.monotonic()
        if not self.gate() or not self._through_middleware():
            return
        chat = self.path == "/v1/chat/completions" or (self.path == "/invocations" and self.path in self.open_posts)
        if not chat:     # an operational route outside /v1 (vLLM's /pause: no key asked) answers; the rest is 404
            return self._json(200, {}) if self.path in self.open_posts else self._json(404, {"detail": "Not Found"})
        if self.path.startswith("/v1/") and not self._authorized():
            return
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        except ValueError:
            return self._json(400, {"error": {"message": "invalid JSON"}})
        k = self.knobs
        if req.get("model") and req["model"] != self.model_name:
            return self._json(404, self.error_body(404, "The model `%s` does not exist." % req["model"],
                                                   "NotFoundError"))
        if k.get("chat_status"):
            code = int(k["chat_status"])
            return self._json(code, self.error_body(code, "sandbox knob chat_status", "InternalServerError"))
        if not self.before_chat(req):
            return
        prompt = " ".join(str(m.get("content", "")) for m in req.get("messages", []))
        text = "%s (%s): %s" % (self.reply_words, "EAGLE-3 on" if self.metrics.spec else "no speculation",
                                prompt[:40])
        if k.get("reply_text") is not None:
            text = str(k["reply_text"])
        if k.get("empty_reply"):
            text = ""
        gen = min(int(req.get("max_tokens") or 16), max(1, len(text.split()))) if text else 1
        self.completed(max(1, len(prompt.split())), gen, time.monotonic() - t0)
        message = ({"role": "assistant", "content": None, self.reasoning_field: text} if k.get("reasoning_only")
                   else {"role": "assistant", "content": text})
        self._json(200, {"id": "%s-%d" % (self.reply_id, int(time.time() * 1000)), "object": "chat.completion",
                         "created": int(time.time()), "model": self.model_name,
                         "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                         "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": gen,
                                   "total_tokens": len(prompt.split()) + gen}})
