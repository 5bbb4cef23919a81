"""Stand-in for pip's ``get-pip.py`` bootstrap that ``ansible-test`` downloads into its cache.

ansible-test fetches get-pip.py from its own file host, which this project's machines cannot reach
(only the package index is reachable).  This does the same job with what every Debian python3-venv
has: ``ensurepip`` puts the bundled pip into the sanity venv, then pip installs the version and the
requirements ansible-test asked for from the package index.  tests/unit/test_lint.py puts it where
ansible-test looks (``~/.ansible/test/cache/get_pip_<version>.py``).
"""
import ensurepip
import subprocess
import sys

ensurepip.bootstrap()
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
