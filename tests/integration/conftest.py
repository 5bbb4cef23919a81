"""Fixtures shared by the sandbox test modules."""
import pytest


@pytest.fixture
def prom(tmp_path):
    """A real Prometheus for one test (prom_helpers.py), on the sandbox of the test's module: its module fixture
    (autouse, module scope) has started the hosts first.  It scrapes twice a second: none outlives its test."""
    from prom_helpers import prometheus
    with prometheus(tmp_path) as p:
        yield p
