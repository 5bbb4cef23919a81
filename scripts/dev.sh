#!/usr/bin/env bash
# One entry point for set-up, the demo and the tests.  Idempotent; run as root on Debian 12.
#   bash scripts/dev.sh demo   # set up, start the sandbox host, run `deployer up --sandbox`
#   bash scripts/dev.sh test   # set up, run the whole test suite (what CI runs: .ci/run)
#
# Everything runs in a scrubbed environment: the PATH of a fresh Debian root and no tool variables
# from the caller's shell (VIRTUAL_ENV, PYTHONPATH, UV_*, ANSIBLE_*, PIP_* ...).  Only the machine's
# network and TLS settings (proxy and CA-bundle variables) are kept, as a user's machine has them.
# So a missing install step fails here, not first on a user's machine.
set -euo pipefail

if [ -z "${_DEPLOYER_DEV_SCRUBBED:-}" ]; then
  keep=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin _DEPLOYER_DEV_SCRUBBED=1)
  for name in $(compgen -e); do
    case "$name" in
      HOME|USER|LOGNAME|LANG|LC_*|TERM|TZ|CI|DEPLOYER_SANDBOX_SLOT|DEPLOYER_TEST_WORKERS|DEPLOYER_TEST_CPU_FILE) keep+=("$name=${!name}") ;;
      http_proxy|https_proxy|no_proxy|all_proxy|HTTP_PROXY|HTTPS_PROXY|NO_PROXY|ALL_PROXY) keep+=("$name=${!name}") ;;
      *CA_BUNDLE*|*CA_CERTS*|SSL_CERT_FILE|SSL_CERT_DIR|*_CAINFO|PIP_CERT) keep+=("$name=${!name}") ;;
    esac
  done
  exec env -i "${keep[@]}" /bin/bash "$0" "$@"
fi

cd "$(dirname "$0")/.."
HERE=$(pwd)
VENV=$HERE/.venv
CACHE=$HOME/.cache/deployer
PY=/usr/bin/python3                       # Debian's python3 (apt package python3), never a PATH lookup
export UV_CACHE_DIR=$HOME/.cache/uv       # the controller's uv cache; sandbox hosts install offline from it

apt_deps() {
  local need=()
  # openssh-*: real sshd on sandbox hosts and the controller's ssh; systemd-container: systemd-nspawn;
  # iproute2: network namespaces; cron: scheduled redeploys without systemd; curl: tests on hosts;
  # haproxy: the sandbox's balancer host (it shares this machine's file system) and the balancer tests;
  # sudo: the sandbox's hosts that refuse root over SSH (`deployer sandbox start --sudo`); gcc, g++, python3-dev: the
  # run-time toolchain the verify stage checks for (Triton's C compiler and Python.h; FlashInfer's c++ under SGLang),
  # which the sandbox's hosts take from this machine's file system; prometheus (its promtool checks and tests the alert
  # rules, its server the monitoring test) and prometheus-node-exporter (the sandbox hosts' node_exporter, which
  # serves the state keeper's deployer.prom); systemd-journal-remote (writes the kernel's Xid lines a rehearsal puts in a
  # sandbox host's journal: sandbox/hosts.py kernel_xids), Debian's own
  for p in openssh-server openssh-client rsync systemd-container systemd-journal-remote iproute2 python3 python3-venv cron curl util-linux haproxy sudo gcc g++ python3-dev prometheus prometheus-node-exporter; do
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
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q uv
  fi
  "$VENV/bin/uv" pip install -q -p "$VENV/bin/python" -e ".[test]"
}

# The engine releases the sandbox serves (vLLM, and SGLang for backend sglang) are installed once on this
# machine, from the index, so that uv's cache holds them; sandbox hosts (no route to any index) install offline
# from that cache.  SGLang 0.5.23: ~1 min and ~10 GB (torch, CUDA libraries) the first time; its GPU-less checks
# run this real SGLang.
prepare_engine() {
  local pkg=$1 v=$2
  local d=$CACHE/venvs/$pkg-$v
  if [ ! -f "$d/.deployer-installed" ]; then
    echo "setup: preparing $pkg $v (cached at $d; ~1-8 min the first time)"
    rm -rf "$d"
    "$VENV/bin/uv" venv -q -p "$PY" "$d"
    "$VENV/bin/uv" pip install -q -p "$d/bin/python" "$pkg==$v"
    echo "$v" > "$d/.deployer-installed"
  fi
  offline_complete "$d" "$pkg==$v"
}
# A sandbox host installs offline, from this cache's index data and only the wheels its prepared venv was installed
# from (deployer/sandbox/image.py: cache_slice), and uv picks the newest version the index data names, not the one
# the venv holds: any later install here that refreshes a shared dependency's index data (this project's own
# `.[test]` names typer, as vLLM does) made every host pick a wheel it was not given.  So each set-up asks uv what an
# offline install picks now (0.1 s) and, when the prepared venv holds anything else, syncs the venv to exactly that
# (from the index where a wheel is missing), then proves the two agree.
picks() {   # picks [--offline] REQUIREMENT [uv options...]: what an install of it picks, one name==version a line
  local off=()
  if [ "$1" = --offline ]; then off=(--offline); shift; fi
  local req=$1; shift
  printf '%s\n' "$req" | "$VENV/bin/uv" pip compile -q "${off[@]}" --no-header --no-annotate -p "$PY" "$@" - \
    2>/dev/null | normalized
}
normalized() { awk -F'==' 'NF == 2 { n = tolower($1); gsub(/[-_.]+/, "-", n); print n "==" $2 }' | sort; }
offline_complete() {   # offline_complete VENV REQUIREMENT [uv options...]
  local d=$1 req=$2; shift 2
  local want have
  want=$(picks --offline "$req" "$@") || want=""
  have=$("$VENV/bin/uv" pip freeze -q -p "$d/bin/python" 2>/dev/null | normalized)
  if [ -n "$want" ] && [ "$want" = "$have" ]; then return 0; fi
  [ -n "$want" ] || want=$(picks "$req" "$@")       # the cache cannot resolve it offline: once from the index
  echo "setup: a host's offline install of $req picks other versions than $d holds: syncing $d to them"
  printf '%s\n' "$want" > "$d/.deployer-picks.txt"
  UV_LINK_MODE=hardlink "$VENV/bin/uv" pip sync -q -p "$d/bin/python" "$d/.deployer-picks.txt"
  want=$(picks --offline "$req" "$@") || want=""
  have=$("$VENV/bin/uv" pip freeze -q -p "$d/bin/python" 2>/dev/null | normalized)
  if [ -z "$want" ] || [ "$want" != "$have" ]; then
    echo "setup: $d still differs from what a host's offline install of $req picks:" >&2
    diff <(printf '%s\n' "$want") <(printf '%s\n' "$have") >&2 || true
    exit 1
  fi
}
prepare_vllm() { prepare_engine vllm "${1:-0.16.0}"; }
# The real-engine sandbox's vLLM (its CPU build, ~6 GB): the pin and its overrides from deployer/sandbox/real_engine.py
prepare_real_engine() {
  local pkg v overrides
  read -r pkg v overrides < <("$VENV/bin/python" -m deployer.sandbox.real_engine)
  local d=$CACHE/venvs/$pkg-$v
  if [ ! -f "$d/.deployer-installed" ]; then
    echo "setup: preparing $pkg $v (cached at $d; ~3-8 min the first time)"
    rm -rf "$d"
    "$VENV/bin/uv" venv -q -p "$PY" "$d"
    printf '%s\n' $overrides > "$d/.overrides.txt"
    "$VENV/bin/uv" pip install -q -p "$d/bin/python" --override "$d/.overrides.txt" "$pkg==$v"
    echo "$v" > "$d/.deployer-installed"
  fi
  offline_complete "$d" "$pkg==$v" --override "$d/.overrides.txt"
}
# Bytecode for the cached wheels, once (scripts/precompile_uv_cache.py says why: a sandbox install ~42 -> ~4 CPU-s)
precompile_uv_cache() { "$PY" scripts/precompile_uv_cache.py "$UV_CACHE_DIR" "$CACHE"; }
prepare_sglang() { prepare_engine sglang "${1:-0.5.23}"; }

# A Python with ansible-core and nothing else: proves plain `ansible-playbook` works without this package.
prepare_plain_ansible() {
  local d=$CACHE/venvs/ansible-core-only
  if [ ! -f "$d/.deployer-installed" ]; then
    rm -rf "$d"
    "$VENV/bin/uv" venv -q -p "$PY" "$d"
    "$VENV/bin/uv" pip install -q -p "$d/bin/python" "ansible-core>=2.19,<2.20"
    touch "$d/.deployer-installed"
  fi
}

case "${1:-}" in
  setup) apt_deps; py_deps; prepare_vllm 0.16.0; prepare_vllm 0.18.0; prepare_vllm 0.33.0; prepare_sglang 0.5.23; prepare_real_engine; prepare_plain_ansible; precompile_uv_cache ;;
  demo)
    apt_deps; py_deps
    if [ "${2:-}" = "--real-engine" ]; then    # the real vLLM (its CPU build) serving a tiny real Kimi-K2.5
      prepare_real_engine
      "$VENV/bin/deployer" sandbox start --real-engine
    else
      prepare_vllm 0.16.0
      "$VENV/bin/deployer" sandbox start
    fi
    exec "$VENV/bin/deployer" up --sandbox ;;
  test)
    apt_deps; py_deps; prepare_vllm 0.16.0; prepare_vllm 0.18.0; prepare_vllm 0.33.0; prepare_sglang 0.5.23; prepare_real_engine; prepare_plain_ansible; precompile_uv_cache
    # three workers: test modules run side by side, each on its own sandbox slot (tests/conftest.py); most of a
    # sandbox test waits on loads and SSH, so three fit two cores (four were slower: 1640 s against
    # 1552 s, every module longer on the shared cores); --durations says where the time goes;
    # --no-loadscope-reorder: modules in tests/conftest.py's HEAVY_FIRST order, not by their number of tests
    export DEPLOYER_TEST_STRICT=1          # tests/helpers.py: what this set-up prepares must be there, never skipped
    exec "$VENV/bin/python" -m pytest -q -ra --durations=25 -n "${DEPLOYER_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "${@:2}" ;;
  *) echo "usage: $0 setup|demo|test [pytest args]"; exit 2 ;;
esac
