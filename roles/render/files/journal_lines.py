"""Run an inference engine and hand everything it prints to journald one line per redraw.

journald splits a service's output into entries at "\\n" only.  A tqdm bar that redraws with "\\r" and prints
one newline when it closes (SGLang's shard bar, vLLM's CUDA-graph bars) therefore reaches the journal as ONE
entry, when the bar ends: for the minutes the bar runs, whoever follows the journal sees no progress.

This wrapper is the unit's main process when ``deployer_log_line_splitter`` is on (the default).  It:
  * runs the engine with its stdout and stderr on one pipe, so their order is the order the engine wrote;
  * writes every piece that ends in "\\r" or "\\n" to its own stdout (the journal) as a line of its own,
    trailing blanks (tqdm's overwrite padding) removed, blank pieces dropped, the value of a secret setting
    (api_key, admin_api_key, hf_token, --api-key) replaced by <redacted>;
  * forwards the signals systemd sends (SIGTERM on stop, as KillMode=mixed sends it to the main process only);
  * exits as the engine did: the same exit code, or killed by the same signal, so systemd's Restart= and the
    deployer's watch see the engine's own end.
It never stops reading, even when writing fails, so the engine can never block on a full pipe.

Standard library only; run by the engine venv's own python with -I -S (no site, no environment).  Shipped into
each release directory by the render role and named in its unit (docs/design.md, "Progress that redraws").
Usage: python3 -I -S journal_lines.py -- ENGINE_ARGV...
"""
import os
import re
import select
import signal
import subprocess
import sys
import time

MAX_PIECE_BYTES = 16384            # a piece with no line end yet is written out at this size (journald: 48K)
DRAIN_AFTER_EXIT_SECONDS = 2.0     # processes the engine left behind may hold the pipe; stop waiting for them
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_ENDS = re.compile(rb"[\r\n]")
# A secret where the engine prints it (SGLang logs server_args, its API key in it, at start-up; an environment dump, a
# crash reporter, an argv list): module_utils/log_lines.py's SECRET_SETTING, on bytes; the value becomes <redacted>.
_SECRET_SETTING = re.compile(
    rb'''(?<![A-Za-z0-9_-])((?:[A-Za-z0-9]+[_-])*(?:api[_-]?key|apikey|[a-z0-9]*token|password|passwd|secret))'''
    rb'''(['"]?\s*[:=]\s*)(\[[^\][]*\]|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|(?:[^\s,)}\]'"]|,(?!\s))+)'''
    rb'''|(?<![A-Za-z0-9-])(--(?:[a-z0-9]+-)*(?:api-key|token|password|secret))(['"]?(?:=|,\s*['"]|\s+))([^\s'",\]]+)'''
    rb'''|(authorization['"]?\s*[:=]\s*['"]?(?:basic|bearer)?\s*|\bbearer\s+)([^\s'",\]]+)''', re.I)
_NOT_SECRET = (b"None", b"null", b"''", b'""')


_HINTS = (b"key", b"token", b"passw", b"secret", b"bearer", b"authorization", b"basic")


def redact(line):
    low = line.lower()
    if not any(h in low for h in _HINTS):     # nearly every line: not searched at all
        return line

    def sub(m):
        if m.group(7) is not None:
            return m.group(7) + b"<redacted>"
        name, sep, value = m.group(1, 2, 3) if m.group(1) else m.group(4, 5, 6)
        return name + sep + (value if value in _NOT_SECRET else b"<redacted>")
    return _SECRET_SETTING.sub(sub, line)


def split(buf):
    """``buf`` -> (complete pieces to write, the unfinished rest).  Pieces end at \\r or \\n."""
    parts = _ENDS.split(buf)
    rest = parts.pop()
    lines = [p.rstrip(b" ") for p in parts]
    if len(rest) >= MAX_PIECE_BYTES:
        lines.append(rest)
        rest = b""
    return [redact(p) for p in lines if p.strip()], rest


def write_lines(fd, lines):
    data = b"".join(p + b"\n" for p in lines)
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:
            return            # the journal is gone: keep reading anyway, never block the engine
        data = data[n:]


def run(argv, out_fd=1):
    """Run ``argv``; return its subprocess returncode (negative: killed by that signal)."""
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(argv, stdout=w, stderr=w)
    finally:
        os.close(w)

    def forward(signum, _frame):
        if proc.returncode is None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass
    for s in FORWARDED:
        signal.signal(s, forward)

    rest, exited_at = b"", None
    while True:
        wait = 0.5 if exited_at is None else max(0.0, exited_at + DRAIN_AFTER_EXIT_SECONDS - time.monotonic())
        ready, _, _ = select.select([r], [], [], wait)
        if ready:
            data = os.read(r, 65536)
            if not data:
                break                      # every writer closed: the engine and whatever it started are gone
            lines, rest = split(rest + data)
            write_lines(out_fd, lines)
        if exited_at is None:
            if proc.poll() is not None:
                exited_at = time.monotonic()
        elif time.monotonic() >= exited_at + DRAIN_AFTER_EXIT_SECONDS:
            break
    if rest.strip():
        write_lines(out_fd, [redact(rest.rstrip(b" "))])
    os.close(r)
    return proc.wait()


def main(args):
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.stderr.write("usage: journal_lines.py -- ENGINE_ARGV...\n")
        return 2
    rc = run(args)
    if rc < 0:                             # end the same way: systemd records the engine's signal
        try:
            signal.signal(-rc, signal.SIG_DFL)
        except (OSError, ValueError):      # SIGKILL and SIGSTOP have no handler to reset
            pass
        os.kill(os.getpid(), -rc)
        return 128 - rc
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
