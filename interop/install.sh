#!/usr/bin/env bash
# Build .venv-interop with the third-party servers of interop/requirements.txt (PyPI only;
# once built, everything starts offline), and fetch llama-cpp-python's source
# distribution for its request schema (llama_cpp/llama_types.py: pure Python; nothing
# is compiled). Rebuilt when this script or requirements.txt changes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-interop
STAMP="$VENV/.installed"
LLAMA_CPP_PYTHON=0.3.36
if [[ ! -f "$STAMP" || interop/requirements.txt -nt "$STAMP" || interop/install.sh -nt "$STAMP" ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -r interop/requirements.txt
    rm -rf "$VENV/sdist" "$VENV/llama_cpp_schema"
    "$VENV/bin/python" -m pip download --quiet --no-deps --no-binary :all: \
        -d "$VENV/sdist" "llama-cpp-python==$LLAMA_CPP_PYTHON"
    mkdir -p "$VENV/llama_cpp_schema"
    tar -xzf "$VENV/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$VENV/llama_cpp_schema" \
        --strip-components=2 "llama_cpp_python-$LLAMA_CPP_PYTHON/llama_cpp/llama_types.py"
    touch "$STAMP"
fi
