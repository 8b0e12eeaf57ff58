#!/usr/bin/env bash
# Lesson 13's worker file on NCCL, on a machine with an NVIDIA GPU (benchmarks/gpu_lesson13.py
# says what it runs). From the repository root: bash benchmarks/gpu_lesson13.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi -L || true
exec "${PYTHON:-python3}" benchmarks/gpu_lesson13.py
