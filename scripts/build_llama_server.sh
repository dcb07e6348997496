#!/usr/bin/env bash
# Build llama.cpp's llama-server (the /infill and /v1/completions server) for the real-engine test
# (tests/test_llamacpp_server.py) and benchmarks/llamacpp.py.
#
# The sources are those the llama-cpp-python sdist on PyPI vendors (its llama.cpp has the glm-dsa
# architecture); llama-cpp-python's own build makes only the library, not this server. Installs to
# ~/.cache/glm5-lsp/llama.cpp/<version>/bin/llama-server; run again: nothing to do once built.
#
#   scripts/build_llama_server.sh            # 59 minutes on 2 busy cores (BENCHMARKS.md), CPU only
#   JOBS=4 scripts/build_llama_server.sh
set -euo pipefail

VERSION=0.3.36
PREFIX="${HOME}/.cache/glm5-lsp/llama.cpp/${VERSION}"
JOBS="${JOBS:-$(nproc)}"

if [[ -x "${PREFIX}/bin/llama-server" ]]; then
    echo "already built: ${PREFIX}/bin/llama-server"
    exit 0
fi
command -v cmake >/dev/null || { echo "cmake is needed (apt-get install cmake g++)" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==${VERSION}" -d "${WORK}"
tar -xzf "${WORK}/llama_cpp_python-${VERSION}.tar.gz" -C "${WORK}"
SRC="${WORK}/llama_cpp_python-${VERSION}/vendor/llama.cpp"

# CPU only, no web UI (it would be downloaded), no TLS, no tests or examples: just the server.
cmake -S "${SRC}" -B "${WORK}/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_NATIVE=ON >/dev/null
cmake --build "${WORK}/build" --target llama-server -j "${JOBS}"
mkdir -p "${PREFIX}/bin"
install -m 755 "${WORK}/build/bin/llama-server" "${PREFIX}/bin/llama-server"
echo "built: ${PREFIX}/bin/llama-server"
