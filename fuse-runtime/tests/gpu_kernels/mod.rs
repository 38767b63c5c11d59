//! Hand-written CUDA kernels for `gpu_runtime.rs`, in the shape the `fuse!` macro emits: every
//! argument in an 8-byte slot, grid-stride loops, and for full reductions the scratch and
//! counter the runtime appends.

use fuse_runtime::__private::{DimRef, Signature, TensorSig};
use fuse_runtime::KernelInfo;

/// `out[i] = a * x[i] + y[i]`: a map with a float scalar.
pub static SAXPY: KernelInfo = KernelInfo {
    name: "saxpy",
    symbol: "fuse_saxpy",
    source: r#"
extern "C" __global__ void fuse_saxpy(const float* x, const float* y, float* out, float a,
                                      unsigned long long n) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += stride) {
        out[i] = a * x[i] + y[i];
    }
}
"#,
    cubins: &[],
};

/// The signature of [`SAXPY`]'s tensors.
pub const SAXPY_SIG: Signature = Signature {
    kernel: "saxpy",
    dims: &["n"],
    tensors: &[
        TensorSig {
            name: "x",
            dims: &[DimRef::Named(0)],
            output: false,
        },
        TensorSig {
            name: "y",
            dims: &[DimRef::Named(0)],
            output: false,
        },
        TensorSig {
            name: "out",
            dims: &[DimRef::Named(0)],
            output: true,
        },
    ],
};

/// `out[i] = x[i] > t`: a map writing `bool` with an `int` scalar.
pub static THRESHOLD: KernelInfo = KernelInfo {
    name: "threshold",
    symbol: "fuse_threshold",
    source: r#"
extern "C" __global__ void fuse_threshold(const int* x, bool* out, int t, unsigned long long n) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += stride) {
        out[i] = x[i] > t;
    }
}
"#,
    cubins: &[],
};

/// `out[r] = max(x[r, ..])`: one block per row, grid-striding over rows.
pub static ROW_MAX: KernelInfo = KernelInfo {
    name: "row_max",
    symbol: "fuse_row_max",
    source: r#"
extern "C" __global__ void fuse_row_max(const float* x, float* out, unsigned long long rows,
                                        unsigned long long cols) {
    __shared__ float best[256];
    for (unsigned long long r = blockIdx.x; r < rows; r += gridDim.x) {
        float m = __int_as_float(0xff800000); // -infinity
        for (unsigned long long c = threadIdx.x; c < cols; c += blockDim.x) {
            m = fmaxf(m, x[r * cols + c]);
        }
        best[threadIdx.x] = m;
        __syncthreads();
        for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) best[threadIdx.x] = fmaxf(best[threadIdx.x], best[threadIdx.x + s]);
            __syncthreads();
        }
        if (threadIdx.x == 0) out[r] = best[0];
        __syncthreads();
    }
}
"#,
    cubins: &[],
};

/// `*out = sum(x)` over `long long`: per-block partials in the scratch, summed in block order
/// by the last block, which resets the counter.
pub static SUM: KernelInfo = KernelInfo {
    name: "sum",
    symbol: "fuse_sum",
    source: r#"
extern "C" __global__ void fuse_sum(const long long* x, long long* out, unsigned long long n,
                                    unsigned long long* scratch, unsigned int* counter) {
    __shared__ long long partial[256];
    __shared__ bool last;
    long long acc = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += stride) {
        acc += x[i];
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        scratch[blockIdx.x] = (unsigned long long)partial[0];
        __threadfence();
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        __threadfence();
        volatile unsigned long long* slots = scratch;
        long long total = 0;
        for (unsigned int b = 0; b < gridDim.x; ++b) total += (long long)slots[b];
        *out = total;
        *counter = 0;
    }
}
"#,
    cubins: &[],
};
