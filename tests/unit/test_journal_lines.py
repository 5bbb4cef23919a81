"""The unit's log-line wrapper (roles/render/files/journal_lines.py): every \\r redraw becomes its own line, the
engine's order, exit code and signal are kept, the signals systemd sends reach the engine, and processes the engine
leaves behind holding the pipe do not keep the wrapper (and so the unit) alive."""
import importlib.util
import signal
import subprocess
import sys
import time

from helpers import ROOT

WRAPPER = ROOT / "roles" / "render" / "files" / "journal_lines.py"
spec = importlib.util.spec_from_file_location("journal_lines", WRAPPER)
jl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(jl)


def wrap(code, timeout=30, **kw):
    """Run ``python -c code`` under the wrapper as systemd would (python -I -S); return the process."""
    return subprocess.Popen([sys.executable, "-I", "-S", str(WRAPPER), "--", sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_split_at_carriage_returns_and_newlines():
    lines, rest = jl.split(b"\rShards:  10% | 1/10   \rShards:  20% | 2/10\r   \r\nINFO done\npartial")
    assert lines == [b"Shards:  10% | 1/10", b"Shards:  20% | 2/10", b"INFO done"]
    assert rest == b"partial"
    lines, rest = jl.split(b"x" * jl.MAX_PIECE_BYTES)       # no line end for too long: written out anyway
    assert lines == [b"x" * jl.MAX_PIECE_BYTES] and rest == b""


def test_a_carriage_return_bar_arrives_as_lines_in_the_order_written_across_stdout_and_stderr():
    code = ("import sys, time\n"
            "print('INFO before', flush=True)\n"
            "for i in range(1, 4):\n"
            "    sys.stderr.write('\\rLoading safetensors checkpoint shards: %3d%% Completed | %d/3' % (i*33, i))\n"
            "    sys.stderr.flush(); time.sleep(0.05)\n"
            "sys.stderr.write('\\n'); print('INFO after', flush=True)\n"
            "sys.stdout.write('no newline at the end'); sys.exit(3)\n")
    p = wrap(code)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 3, err                                        # the engine's own exit code
    assert out.decode().splitlines() == [
        "INFO before",
        "Loading safetensors checkpoint shards:  33% Completed | 1/3",
        "Loading safetensors checkpoint shards:  66% Completed | 2/3",
        "Loading safetensors checkpoint shards:  99% Completed | 3/3",
        "INFO after", "no newline at the end"]


def test_the_engine_killed_by_a_signal_ends_the_wrapper_by_the_same_signal():
    p = wrap("import os, signal; print('going', flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    out, _ = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL and out == b"going\n"        # systemd records status=9/KILL


def test_sigterm_to_the_wrapper_reaches_the_engine_which_decides_how_to_end():
    # os.write, not print: a SIGTERM that lands while print('ready') still holds stdout's buffer lock would make the
    # handler's print raise "reentrant call inside <_io.BufferedWriter name='<stdout>'>" (seen once in CI)
    code = ("import os, signal, sys, time\n"
            "def bye(*a):\n"
            "    os.write(1, b'engine got SIGTERM, shutting down\\n'); sys.exit(7)\n"
            "signal.signal(signal.SIGTERM, bye)\n"
            "os.write(1, b'ready\\n')\n"
            "time.sleep(60)\n")
    p = wrap(code)
    assert p.stdout.readline() == b"ready\n"
    p.send_signal(signal.SIGTERM)                  # what KillMode=mixed sends the main process on stop
    out, _ = p.communicate(timeout=30)
    assert out == b"engine got SIGTERM, shutting down\n" and p.returncode == 7


def test_a_process_left_behind_holding_the_pipe_does_not_keep_the_wrapper_alive():
    code = ("import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"   # inherits stdout
            "print('engine exits', flush=True)\n")
    t0 = time.monotonic()
    p = wrap(code, start_new_session=True)
    out, _ = p.communicate(timeout=30)
    took = time.monotonic() - t0
    subprocess.run(["pkill", "-s", str(p.pid)], check=False)
    assert out == b"engine exits\n" and p.returncode == 0
    assert took < jl.DRAIN_AFTER_EXIT_SECONDS + 5, took                   # not the 30 s the orphan lives


def test_usage_without_a_command():
    p = subprocess.run([sys.executable, "-I", "-S", str(WRAPPER), "--"], capture_output=True, timeout=30)
    assert p.returncode == 2 and b"usage" in p.stderr
