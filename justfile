# Mirrors the README's set-up commands and the tour (docs/development.md). `just --list` shows them.
venv := ".venv"

# create the virtual environment and install sdpa_probe with its test tools
setup:
    python3 -m venv {{venv}} && {{venv}}/bin/pip install -q -c constraints.txt -e '.[dev]'

# the test suite (what CI runs)
test: setup
    {{venv}}/bin/pytest

# check every native kernel and torch against the float64 oracle
check: setup
    {{venv}}/bin/probe check

# the slow suites
test-slow: setup
    {{venv}}/bin/pytest -m slow

# the speed regression guards (timed ratios): on a quiet machine
test-perf: setup
    {{venv}}/bin/pytest -m perf

# per-op decode-step profile, decomposed vs fused attention
profile: setup
    {{venv}}/bin/probe profile --model llama-3.2-1b --ab decomposed,fused --context 100,1000,2000

# kernel benchmarks against torch (and ExecuTorch when installed)
bench: setup
    {{venv}}/bin/probe bench --vs torch,executorch

# where the AVX-512 decode block's cycles go (one thread, phase by phase)
block-cycles *ARGS: setup
    {{venv}}/bin/python benchmarks/block_cycles.py {{ARGS}}

# ExecuTorch's CPU ops as an extra backend (its Python package is never imported)
executorch: setup
    {{venv}}/bin/pip install --no-deps executorch==1.5.1

lint: setup
    {{venv}}/bin/ruff check sdpa_probe tests
