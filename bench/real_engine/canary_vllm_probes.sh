#!/usr/bin/env bash
# The GPU canary's vLLM probes (roles/canary/files/gpu_canary.py --probe ...) against a real vLLM build on a GPU
# machine (no network, torch 2.11 / CUDA 13: vLLM 0.22.0 matches it).  A call carries at most 64 MiB, so the
# pieces come in three calls (the machine keeps /tmp while it stays warm):
#   a: vLLM's Python files and dist-info (py.tar.xz), _moe_C.abi3.so (moe.xz), the wheels the machine lacks for
#      `import vllm._custom_ops` (pyzmq, dill)                         -> bash canary_vllm_probes.sh unpack .gpu-carry/a
#   b: the first 40 MiB of _C.abi3.so, xz'd                             -> bash canary_vllm_probes.sh keep .gpu-carry/b
#   c: the rest of it and _C_stable_libtorch (stable.xz)                -> bash canary_vllm_probes.sh keep .gpu-carry/c
#   d: vllm_flash_attn/_vllm_fa2_C.abi3.so (fa2.xz, 54 MB); then the canary runs, one rank on the GPU
#                                                                       -> bash canary_vllm_probes.sh run .gpu-carry/d
# Made here from the wheel (pip download --no-deps --python-version 3.12 --platform manylinux_2_28_x86_64
# vllm==0.22.0): see docs/real-engine.md "The canary's vLLM probes on a GPU".  What it printed is kept in
# tests/fixtures/real-gpu/canary/.
set -euo pipefail
SITE=/tmp/vllm-0.22.0-site
PARTS=/tmp/vllm-0.22.0-parts
case "$1" in
  unpack)
    rm -rf "$SITE" "$PARTS"; mkdir -p "$SITE" "$PARTS"
    tar -xJf "$2/py.tar.xz" -C "$SITE"
    xz -dc "$2/moe.xz" > "$SITE/vllm/_moe_C.abi3.so"
    python3 -m pip install -q --no-deps --no-index --target "$SITE" "$2"/*.whl
    du -sh "$SITE"; nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
    python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' ;;
  keep|run)
    cp "$2"/C.xz.part.* "$PARTS/" 2>/dev/null || true
    # vllm/platforms/cuda.py imports _C_stable_libtorch at once (0.22); FA2 for the vllm_fa2 probe
    if [ -f "$2/stable.xz" ]; then xz -dc "$2/stable.xz" > "$SITE/vllm/_C_stable_libtorch.abi3.so"; fi
    if [ -f "$2/fa2.xz" ]; then xz -dc "$2/fa2.xz" > "$SITE/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"; fi
    ls -la "$PARTS"
    [ "$1" = run ] || exit 0
    [ -f "$SITE/vllm/_C.abi3.so" ] || cat "$PARTS"/C.xz.part.* | xz -dc > "$SITE/vllm/_C.abi3.so"
    export PYTHONPATH="$SITE"
    python3 -c 'import vllm, vllm._custom_ops as o, inspect; print("vllm", vllm.__version__, inspect.signature(o.gptq_marlin_repack))'
    # a rank runs `python -I` (the venv's Python: its own site-packages only); this vLLM is on PYTHONPATH instead
    for i in 1 2; do       # the second: warm (the probes' JIT and Triton's caches filled by the first)
      /usr/bin/time -f "canary run $i: %e s wall" python3 roles/canary/files/gpu_canary.py --world 1 --timeout-s 300 \
        --rank-program python3 --rank-program "$PWD/roles/canary/files/gpu_canary.py" \
        --probe vllm_marlin_repack --probe vllm_moe_topk --probe vllm_marlin_moe --probe vllm_fa2 | tee "${OUT:-/tmp}/canary_vllm_0.22.0_run$i.txt"
    done ;;
  *) echo "usage: $0 unpack|keep|run DIR" >&2; exit 2 ;;
esac
