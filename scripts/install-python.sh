#!/usr/bin/env bash
# Builds smla's Python package against the system interpreter (/usr/bin/python3 unless
# PYTHON=... names another) and installs it into that interpreter's site-packages. No network.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
python=${PYTHON:-/usr/bin/python3}
cmake --preset release -DSMLA_PYTHON=ON -DPython_EXECUTABLE="$python"
cmake --build --preset release -j "$(nproc)" --target smla_python
cmake --install build/release --component python
"$python" -c "import smla; print('installed smla', smla.__version__, 'backends', smla.info()['available_backends'])"
