#!/usr/bin/env bash
# Installs the llama.cpp peer row's package (llama-cpp-python, built from source with cmake, 3-4 minutes on 2 cores)
# into .venv. Idempotent: an installed build is kept.
#
# The build is not GGML_NATIVE: some VMs report AMX in /proc/cpuinfo but fault on its tile instructions, and
# llama.cpp's native build then crashes (SIGILL) at the first decode. Instead every instruction set the CPU lists is
# enabled by name, and AMX never is (docs/quantization.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    exit 0
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
has avx2 && args="$args -DGGML_AVX2=ON"
has fma && args="$args -DGGML_FMA=ON"
has f16c && args="$args -DGGML_F16C=ON"
has avx512f && args="$args -DGGML_AVX512=ON"
has avx512_vnni && args="$args -DGGML_AVX512_VNNI=ON"
has avx512_bf16 && args="$args -DGGML_AVX512_BF16=ON"
has avx512vbmi && args="$args -DGGML_AVX512_VBMI=ON"
has avx_vnni && args="$args -DGGML_AVX_VNNI=ON"
echo "building llama-cpp-python with CMAKE_ARGS=$args" >&2
CMAKE_ARGS="$args" .venv/bin/python -m pip install -q "llama-cpp-python==0.3.36" \
    2> >(grep -v "^WARNING: Location 'file://" >&2)
