"""A real Prometheus for the sandbox tests: Debian's ``prometheus`` (scripts/dev.sh installs it) on loopback, run on
what ``deployer monitoring --sandbox`` writes (the sandbox's hosts: node_exporter with the state keeper's metrics,
and the engines' /metrics) with the project's alert rules.  Two changes, both to time only: it scrapes and evaluates
twice a second, and every ``for:`` is 60 times shorter (a minute a second), so that an alert fires within a test's
deploy.  The rules' expressions, what the sandbox proves, are as shipped; their durations are promtool's rule tests
(tests/prometheus/)."""
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager

from sandbox_helpers import deployer

PROMETHEUS = shutil.which("prometheus", path="/usr/bin:/bin")


def faster(rules: str) -> str:
    """The rules with each ``for:`` a minute a second (1m -> 1s, 2h -> 2m)."""
    return re.sub(r"(\bfor: )(\d+)([mh])\b", lambda m: m.group(1) + m.group(2) + {"m": "s", "h": "m"}[m.group(3)],
                  rules)


class Prometheus:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params) -> dict:
        url = f"{self.base}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)

    def query(self, expr: str) -> list:
        return self.get("/api/v1/query", query=expr)["data"]["result"]

    def samples(self, expr: str, start: float, end: float, step: float = 0.5) -> list:
        """Every (time, labels, value) of ``expr`` between ``start`` and ``end``, as Prometheus evaluates it."""
        res = self.get("/api/v1/query_range", query=expr, start=start, end=end, step=step)["data"]["result"]
        return [(float(t), s["metric"], float(v)) for s in res for t, v in s["values"]]

    def firing(self, alert: str, start: float, end: float) -> list:
        """When ``alert`` was firing between ``start`` and ``end`` (Prometheus' own ALERTS series)."""
        return self.samples(f'ALERTS{{alertname="{alert}",alertstate="firing"}}', start, end)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def prometheus(workdir):
    """Prometheus on the sandbox of this test module, until the block ends."""
    r = deployer("monitoring", "--sandbox", "--out", str(workdir), "--scrape-interval-seconds", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = (workdir / "prometheus.yml").read_text()
    (workdir / "prometheus.yml").write_text(cfg.replace("scrape_interval: 1s", "scrape_interval: 500ms")
                                            .replace("evaluation_interval: 1s", "evaluation_interval: 500ms"))
    rules = workdir / "deployer-alerts.yml"
    rules.write_text(faster(rules.read_text()))
    port = _free_port()
    with open(workdir / "prometheus.log", "wb") as log:
        p = subprocess.Popen([PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}",
                              f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                              "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    prom = Prometheus(port)
    try:
        for _ in range(100):
            try:
                if prom.query("up"):
                    break
            except OSError:
                pass
            assert p.poll() is None, (workdir / "prometheus.log").read_text()
            time.sleep(0.2)
        yield prom
    finally:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
