#!/usr/bin/env bash
# Builds the candle example (src/main.rs) on a machine without a GPU or a CUDA toolkit, and stages
# it as .gpu/examples/candle when ../shared/gpu/pack has made .gpu:
#
#   interop/candle/build.sh
#
# candle-core's `cuda` feature needs two things CI does not have, so the example lives outside the
# workspace and CI does not build it:
# - `nvcc`, to compile candle's kernels to PTX when building: here it comes from PyPI's CUDA 13.0
#   wheels (nvcc, nvvm and crt pinned together: a newer nvvm writes PTX that ptxas 13.0 rejects),
#   with CUDA_COMPUTE_CAP naming the GPU (90 for an H100 or H200) since there is none to ask;
# - the CUDA libraries to link against (cudarc's `dynamic-linking`): libcuda, libcublas,
#   libcublasLt and libcurand are replaced by stand-ins with their real SONAMEs and every
#   function cudarc declares, so the program links here and loads the real libraries on the GPU
#   machine; NVRTC and the CUDA runtime are the real ones, from PyPI's wheels.
# candle also compiles its quantized-matmul and MoE kernels for the GPU when building, which takes
# most of the build's time (about 15 minutes on two cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cuda=$HOME/.cache/fuse-cuda
if [ ! -x "$cuda/nvidia/cu13/bin/nvcc" ]; then
  rm -rf "$cuda"
  python3 -m pip install --quiet --disable-pip-version-check --target "$cuda" \
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
fi
nvrtc=$HOME/.cache/fuse-ci/nvrtc/nvidia/cu13/lib
if [ ! -e "$nvrtc/libnvrtc.so.13" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$HOME/.cache/fuse-ci/nvrtc" \
    nvidia-cuda-nvrtc==13.0.88
fi

# The stand-ins: one C function per name cudarc declares for each library.
stubs=$root/target/candle/stubs
mkdir -p "$stubs/lib64"
ln -sfn "$cuda/nvidia/cu13/include" "$stubs/include"
cudarc=$(ls -d "$HOME"/.cargo/registry/src/*/cudarc-0.19.* 2>/dev/null | sort -V | tail -1)
if [ -z "$cudarc" ]; then
  cargo fetch --manifest-path "$here/Cargo.toml" >/dev/null
  cudarc=$(ls -d "$HOME"/.cargo/registry/src/*/cudarc-0.19.* | sort -V | tail -1)
fi
stub() { # library, soname, cudarc module
  grep -oE '^\s+fn [a-zA-Z_0-9]+\(' "$cudarc/src/$3/sys/mod.rs" | sed -E 's/^\s+fn ([a-zA-Z_0-9]+)\(/void \1(void) {}/' \
    | sort -u >"$stubs/$1.c"
  gcc -shared -fPIC -o "$stubs/lib64/lib$1.so" -Wl,-soname,"$2" "$stubs/$1.c"
}
stub cuda libcuda.so.1 driver
stub cublas libcublas.so.13 cublas
stub cublasLt libcublasLt.so.13 cublaslt
stub curand libcurand.so.10 curand
ln -sf "$nvrtc/libnvrtc.so.13" "$stubs/lib64/libnvrtc.so"
# candle's statically built MoE kernels link the CUDA runtime: the wheel's, a real one.
ln -sf "$cuda/nvidia/cu13/lib/libcudart.so.13" "$stubs/lib64/libcudart.so"

export PATH=$cuda/nvidia/cu13/bin:$PATH
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export CUDA_HOME=$stubs
cargo build --release --manifest-path "$here/Cargo.toml" --target-dir "$root/target/candle"
if [ -d "$root/.gpu" ]; then
  mkdir -p "$root/.gpu/examples"
  cp "$root/target/candle/release/candle" "$root/.gpu/examples/candle"
  strip "$root/.gpu/examples/candle" 2>/dev/null || true
  echo "staged .gpu/examples/candle"
fi
