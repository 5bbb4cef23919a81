#!/usr/bin/env bash
# The real-engine bench on a GPU machine reached one command at a time (one H200, Python 3.12, torch 2.11 / CUDA 13,
# no network).  vLLM (0.20.0, 0.25.1) and the wheels that machine lacks travel in parts under .gpu/ (64 MiB a call): `stash` keeps a part on the machine; the last call assembles, installs, runs, packs $OUT/runs.tgz.
#   bash bench/real_engine/run_on_device.sh stash
#   bash bench/real_engine/run_on_device.sh cold warm mt_prefetch sigkill gpu_busy
set -euo pipefail
W=/root/w
mkdir -p "$W"
for p in .gpu/part-*; do [ -f "$p" ] && cp "$p" "$W/"; done
[ "${1:-}" = stash ] && { ls -l "$W"; exit 0; }
if [ ! -d /tmp/site/vllm ]; then
  cat "$W"/part-* > "$W/wheels.tar"
  mkdir -p "$W/wheels" && tar -C "$W/wheels" -xf "$W/wheels.tar"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$W"/wheels/*.whl
fi
export PYTHONPATH=/tmp/site
python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))'
python3 -c 'import vllm.entrypoints.cli.main, vllm.v1.engine.core, vllm.v1.spec_decode.eagle' || exit 3   # a module it imports at start is missing
[ -d /root/m/target_big ] || python3 bench/real_engine/make_models.py /root/m
python3 bench/real_engine/harness.py --models /root/m --out /root/runs "$@" || true
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap --format=csv,noheader,nounits \
  > /root/runs/nvidia-smi.txt || true
tar -C /root -czf "$OUT/runs.tgz" runs
