"""deployer/source_check.py: what a script imports from an engine, against a release's source (no import)."""
from deployer.source_check import missing_imports

SCRIPT = """
from vllm.entrypoints.cli.serve import ServeSubcommand, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.gone.module import thing
import json
from json import loads
"""
SOURCE = {
    "vllm/entrypoints/cli/serve.py": "from vllm.entrypoints.common.cli_args import validate_parsed_serve_args\n"
                                     "class ServeSubcommand: pass\n",
    "vllm/engine/arg_utils/__init__.py": "AsyncEngineArgs = object\n",
}


def test_names_moved_or_gone_are_named_and_re_exports_count():
    assert missing_imports(SCRIPT, "vllm", SOURCE.get) == ["vllm.gone.module"]
    gone = dict(SOURCE, **{"vllm/entrypoints/cli/serve.py": "class ServeSubcommand: pass\n"})
    assert missing_imports(SCRIPT, "vllm", gone.get) == ["vllm.entrypoints.cli.serve.validate_parsed_serve_args",
                                                         "vllm.gone.module"]
