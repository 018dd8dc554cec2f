#!/usr/bin/env bash
# Create .venv with distnerf, its test dependencies and its optional tools' (viewer, profiling, COLMAP, W&B workspace).
# On CPU-only machines torch is pinned to the local CPU build (torch==2.13.0); set
# DISTNERF_TORCH="torch==X+cu12Y" (or an empty string to keep an existing torch) on GPU machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -d .venv ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
TORCH_SPEC="${DISTNERF_TORCH-torch==2.13.0}"
quiet() { grep -v "^WARNING: Location" || true; }  # this machine's pip mirrors print one line per package
if [ -n "$TORCH_SPEC" ]; then
  python -m pip install -q "$TORCH_SPEC" 2>&1 | quiet
fi
python -m pip install -q -e ".[test,profile,colmap,viewer,wandb,export]" 2>&1 | quiet
# the viewer's browser test (tests/e2e/test_viewer.py) drives Debian's chromium; installed only when missing
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver; } \
    >/dev/null 2>&1 || echo "setup_env: could not install chromium (tests/e2e/test_viewer.py will skip)" >&2
fi
python -c "import torch, distnerf; print('torch', torch.__version__, '| distnerf ready')"
