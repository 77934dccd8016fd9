#!/usr/bin/env bash
# Builds smla's Python package against the system interpreter (/usr/bin/python3 unless
# PYTHON=... names another) and installs it into that interpreter's site-packages. No network.
# The CUDA backend is built when nvcc is found (pass SMLA_ENABLE_CUDA=OFF to skip it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
python=${PYTHON:-/usr/bin/python3}
build=build/python-install
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSMLA_PYTHON=ON -DPython_EXECUTABLE="$python" \
  -DSMLA_ENABLE_CUDA="${SMLA_ENABLE_CUDA:-ON}" -DSMLA_BUILD_TESTS=OFF -DSMLA_BUILD_BENCH=OFF -DSMLA_BUILD_TOOLS=OFF
cmake --build "$build" -j "$(nproc)" --target smla_python
cmake --install "$build" --component python
cd /
"$python" -c "import smla; print('installed smla', smla.__version__, 'at', smla.__file__, 'backends', smla.info()['available_backends'])"
