# Thin wrapper; scripts/dev.sh is the source of truth (make is not on a fresh Debian).
.PHONY: setup demo test unit bench bench-recovery bench-cpu
setup: ; bash scripts/dev.sh setup
demo: ; bash scripts/dev.sh demo
test: ; bash scripts/dev.sh test
unit: ; bash scripts/dev.sh test tests/unit
bench: ; .venv/bin/python bench/ratios.py
bench-recovery: ; .venv/bin/python bench/recovery.py
bench-cpu: ; .venv/bin/python bench/deploy_cpu.py   # controller and host CPU per deploy (a running sandbox)
