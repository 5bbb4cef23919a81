#!/usr/bin/env bash
# One entry point for set-up, the demo and the tests.  Idempotent; run as root on Debian 12.
#   bash scripts/dev.sh demo   # set up, start the sandbox host, run `deployer up --sandbox`
#   bash scripts/dev.sh test   # set up, run the whole test suite
set -euo pipefail
cd "$(dirname "$0")/.."
HERE=$(pwd)
VENV=$HERE/.venv
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/deployer
export UV_CACHE_DIR=${UV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/uv}

apt_deps() {
  local need=()
  for p in openssh-server openssh-client rsync systemd-container iproute2 python3 python3-venv cron curl; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  mkdir -p /run/sshd
}

py_deps() {
  if [ ! -x "$VENV/bin/uv" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q uv
  fi
  "$VENV/bin/uv" pip install -q -p "$VENV/bin/python" -e ".[test]"
}

# The vLLM release the sandbox serves is installed once on this machine, from the index, so that
# uv's cache holds it; sandbox hosts (no route to any index) install offline from that cache.
prepare_vllm() {
  local v=${1:-0.16.0}
  local d=$CACHE/venvs/vllm-$v
  if [ ! -f "$d/.deployer-installed" ]; then
    echo "setup: preparing vLLM $v (cached at $d; ~1 min the first time)"
    rm -rf "$d"
    "$VENV/bin/uv" venv -q -p /usr/bin/python3 "$d"
    "$VENV/bin/uv" pip install -q -p "$d/bin/python" "vllm==$v"
    echo "$v" > "$d/.deployer-installed"
  fi
}

case "${1:-}" in
  setup) apt_deps; py_deps; prepare_vllm 0.16.0; prepare_vllm 0.18.0 ;;
  demo)
    apt_deps; py_deps; prepare_vllm 0.16.0
    "$VENV/bin/deployer" sandbox start
    exec "$VENV/bin/deployer" up --sandbox ;;
  test)
    apt_deps; py_deps; prepare_vllm 0.16.0; prepare_vllm 0.18.0   # 0.18.0: the natively supported path
    exec "$VENV/bin/python" -m pytest -q -ra "${@:2}" ;;
  *) echo "usage: $0 setup|demo|test [pytest args]"; exit 2 ;;
esac
