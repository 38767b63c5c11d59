// NOTES.md item 87: on the GPU machine, `nvcc -O3 -arch=sm_90 -o colsum colsum.cu && ./colsum`.
// Column-sum variants for 16-bit and f32 inputs: V columns a lane (V*sizeof(T) bytes a load),
// U rows unrolled, blocks of 256 threads (8 warps splitting the rows), BPS blocks an SM aimed at,
// tiles split across blocks with partials combined by the tile's last block in a fixed order.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cmath>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ float bf(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
__device__ __forceinline__ unsigned short to_bf(float f) {
    unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
template <int BYTES> struct Raw;
template <> struct Raw<2> { typedef unsigned short t; };
template <> struct Raw<4> { typedef unsigned int t; };
template <> struct Raw<8> { typedef uint2 t; };
template <> struct Raw<16> { typedef uint4 t; };

template <typename T> struct El;
template <> struct El<unsigned short> {
    static __device__ __forceinline__ float get(const void* p, int j) { return bf(((const unsigned short*)p)[j]); }
    static __device__ __forceinline__ unsigned short put(float f) { return to_bf(f); }
};
template <> struct El<float> {
    static __device__ __forceinline__ float get(const void* p, int j) { return ((const float*)p)[j]; }
    static __device__ __forceinline__ float put(float f) { return f; }
};

template <typename T, int V, int U, int BPS, int W>
__global__ void __launch_bounds__(256, BPS) colsum(const T* __restrict__ x, T* __restrict__ out,
    long long len, long long groups, float* __restrict__ scratch, unsigned* __restrict__ counter) {
    typedef typename Raw<V * sizeof(T)>::t R;
    __shared__ float red[V][256];
    __shared__ bool last;
    const int lane = threadIdx.x & (32 * W - 1), slice = threadIdx.x / (32 * W);
    constexpr int S = 8 / W;
    const long long tw = 32LL * W * V;
    const long long tiles = (groups + tw - 1) / tw;
    const long long splits = gridDim.x >= tiles ? gridDim.x / tiles : 1;
    const long long per = (len + splits - 1) / splits;
    for (long long b = blockIdx.x; b < tiles * splits; b += gridDim.x) {
        const long long tile = b / splits, part = b - tile * splits;
        const long long gl = tile * tw + lane * V;
        const bool live = gl < groups;
        const long long g = live ? gl : groups - V;
        const long long r0 = part * per, r1 = r0 + per < len ? r0 + per : len;
        float acc[V];
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = 0.f;
#pragma unroll U
        for (long long r = r0 + slice; r < r1; r += S) {
            R v = *(const R*)(x + r * groups + g);
#pragma unroll
            for (int j = 0; j < V; ++j) acc[j] += El<T>::get(&v, j);
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < V; ++j) red[j][threadIdx.x] = acc[j];
        __syncthreads();
#pragma unroll
        for (int j = 0; j < V; ++j) {
            acc[j] = red[j][lane];
#pragma unroll
            for (int w = 1; w < S; ++w) acc[j] += red[j][w * 32 * W + lane];
        }
        if (splits > 1) {
            if (slice == 0 && live) {
#pragma unroll
                for (int j = 0; j < V; ++j) scratch[part * groups + g + j] = acc[j];
            }
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) last = atomicAdd(counter + tile, 1u) == (unsigned)(splits - 1);
            __syncthreads();
            if (!last) continue;
            __threadfence();
#pragma unroll
            for (int j = 0; j < V; ++j) acc[j] = 0.f;
            for (long long s = slice; s < splits; s += S) {
#pragma unroll
                for (int j = 0; j < V; ++j) acc[j] += ((volatile float*)scratch)[s * groups + g + j];
            }
            __syncthreads();
#pragma unroll
            for (int j = 0; j < V; ++j) red[j][threadIdx.x] = acc[j];
            __syncthreads();
#pragma unroll
            for (int j = 0; j < V; ++j) {
                acc[j] = red[j][lane];
#pragma unroll
                for (int w = 1; w < S; ++w) acc[j] += red[j][w * 32 * W + lane];
            }
            if (threadIdx.x == 0) counter[tile] = 0u;
        }
        if (live && slice == 0) {
#pragma unroll
            for (int j = 0; j < V; ++j) out[g + j] = El<T>::put(acc[j]);
        }
    }
}

static int sms;
static float* scratch;
static unsigned* counter;

template <typename T, int V, int U, int BPS, int W = 1>
void run(const char* tname, const T* x, T* out, long long rows, long long cols, double copy_gbs, std::vector<double>& ref) {
    long long tw = 32LL * W * V;
    long long tiles = (cols + tw - 1) / tw;
    long long target = (long long)sms * BPS;
    long long parts = target / tiles;
    long long maxp = (rows + 63) / 64;
    if (parts > maxp) parts = maxp;
    if (parts < 1) parts = 1;
    long long blocks = tiles * parts;
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    for (int i = 0; i < 3; ++i) colsum<T, V, U, BPS, W><<<blocks, 256>>>(x, out, rows, cols, scratch, counter);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const int iters = 20;
    cudaEventRecord(a);
    for (int i = 0; i < iters; ++i) colsum<T, V, U, BPS, W><<<blocks, 256>>>(x, out, rows, cols, scratch, counter);
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b); ms /= iters;
    // check
    std::vector<T> h(cols);
    CK(cudaMemcpy(h.data(), out, cols * sizeof(T), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (long long c = 0; c < cols; ++c) {
        float v;
        if (sizeof(T) == 2) { unsigned u = ((unsigned short*)h.data())[c]; u <<= 16; memcpy(&v, &u, 4); }
        else memcpy(&v, &h[c], 4);
        double e = fabs(v - ref[c]) / (fabs(ref[c]) + 1.0);
        if (!(e <= worst)) worst = e;
    }
    double bytes = (double)rows * cols * sizeof(T) + cols * sizeof(T);
    double gbs = bytes / (ms * 1e6);
    printf("%-5s %8lld x %-8lld W=%d V=%d U=%d BPS=%d blocks=%6lld parts=%4lld  %8.4f ms  %6.0f GB/s  %5.1f%%  err %.2e\n",
           tname, rows, cols, W, V, U, BPS, blocks, parts, ms, gbs, 100 * gbs / copy_gbs, worst);
    cudaEventDestroy(a); cudaEventDestroy(b);
}


// Pairs: a lane loads two adjacent columns of its row (rp + h), swaps one with lane ^ 16 (the
// other row), and accumulates its one column over both rows.
template <int U, int BPS>
__global__ void __launch_bounds__(256, BPS) colsum_pairs(const unsigned short* __restrict__ x, unsigned short* __restrict__ out,
    long long len, long long groups, float* __restrict__ scratch, unsigned* __restrict__ counter) {
    __shared__ float red[256];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
    const int h = lane >> 4, p = lane & 15;
    const long long tiles = (groups + 31) / 32;
    const long long splits = gridDim.x >= tiles ? gridDim.x / tiles : 1;
    const long long per = (len + splits - 1) / splits;
    for (long long b = blockIdx.x; b < tiles * splits; b += gridDim.x) {
        const long long tile = b / splits, part = b - tile * splits;
        const long long gl = tile * 32 + 2 * p + h;
        const bool live = gl < groups;
        const long long g = live ? gl : groups - 2 + h;
        const long long r0 = part * per, r1 = r0 + per < len ? r0 + per : len;
        float acc = 0.f;
        long long rp = r0 + slice * 2;
#pragma unroll U
        for (; rp + 1 < r1; rp += 16) {
            const unsigned int v = *(const unsigned int*)(x + (rp + h) * groups + g - h);
            const unsigned short own = h ? (unsigned short)(v >> 16) : (unsigned short)v;
            const unsigned short give = h ? (unsigned short)v : (unsigned short)(v >> 16);
            const unsigned short other = (unsigned short)__shfl_xor_sync(0xffffffffu, (unsigned int)give, 16);
            acc += bf(own);
            acc += bf(other);
        }
        if (rp < r1) acc += bf(x[rp * groups + g]);
        __syncthreads();
        red[threadIdx.x] = acc;
        __syncthreads();
        acc = red[lane];
#pragma unroll
        for (int w = 1; w < 8; ++w) acc += red[w * 32 + lane];
        if (splits > 1) {
            if (slice == 0 && live) scratch[part * groups + g] = acc;
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) last = atomicAdd(counter + tile, 1u) == (unsigned)(splits - 1);
            __syncthreads();
            if (!last) continue;
            __threadfence();
            acc = 0.f;
            for (long long s = slice; s < splits; s += 8) acc += ((volatile float*)scratch)[s * groups + g];
            __syncthreads();
            red[threadIdx.x] = acc;
            __syncthreads();
            acc = red[lane];
#pragma unroll
            for (int w = 1; w < 8; ++w) acc += red[w * 32 + lane];
            if (threadIdx.x == 0) counter[tile] = 0u;
        }
        if (live && slice == 0) out[g] = to_bf(acc);
    }
}

template <int U, int BPS>
void run_pairs(const unsigned short* x, unsigned short* out, long long rows, long long cols, double copy_gbs, std::vector<double>& ref) {
    long long tiles = (cols + 31) / 32;
    long long target = (long long)sms * BPS;
    long long parts = target / tiles;
    long long maxp = (rows + 63) / 64;
    if (parts > maxp) parts = maxp;
    if (parts < 1) parts = 1;
    long long blocks = tiles * parts;
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    for (int i = 0; i < 3; ++i) colsum_pairs<U, BPS><<<blocks, 256>>>(x, out, rows, cols, scratch, counter);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const int iters = 20;
    cudaEventRecord(a);
    for (int i = 0; i < iters; ++i) colsum_pairs<U, BPS><<<blocks, 256>>>(x, out, rows, cols, scratch, counter);
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b); ms /= iters;
    std::vector<unsigned short> h(cols);
    CK(cudaMemcpy(h.data(), out, cols * 2, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (long long c = 0; c < cols; ++c) {
        float v; unsigned u = h[c]; u <<= 16; memcpy(&v, &u, 4);
        double e = fabs(v - ref[c]) / (fabs(ref[c]) + 1.0);
        if (!(e <= worst)) worst = e;
    }
    double bytes = (double)rows * cols * 2 + cols * 2;
    double gbs = bytes / (ms * 1e6);
    printf("bf16  %8lld x %-8lld PAIRS U=%d BPS=%d blocks=%6lld parts=%4lld  %8.4f ms  %6.0f GB/s  %5.1f%%  err %.2e\n",
           rows, cols, U, BPS, blocks, parts, ms, gbs, 100 * gbs / copy_gbs, worst);
}

__global__ void fill_bf(unsigned short* x, long long n, unsigned seed) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)(i * 2654435761u) ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
        float f = ((h & 0xffff) / 65536.0f) - 0.3f;
        x[i] = to_bf(f);
    }
}
__global__ void fill_f(float* x, long long n, unsigned seed) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)(i * 2654435761u) ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
        x[i] = ((h & 0xffff) / 65536.0f) - 0.3f;
    }
}
__global__ void ref_sum(const void* x, int bf16, long long rows, long long cols, double* out) {
    long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (c >= cols) return;
    double s = 0;
    for (long long r = 0; r < rows; ++r)
        s += bf16 ? (double)bf(((const unsigned short*)x)[r * cols + c]) : (double)((const float*)x)[r * cols + c];
    out[c] = s;
}

int main() {
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0)); sms = p.multiProcessorCount;
    printf("%s, %d SMs\n", p.name, sms);
    const long long n = 1LL << 28;
    void* x; void* y; CK(cudaMalloc(&x, n * 4)); CK(cudaMalloc(&y, n * 4));
    CK(cudaMalloc(&scratch, 1 << 26)); CK(cudaMalloc(&counter, 1 << 20)); CK(cudaMemset(counter, 0, 1 << 20));
    double* dref; CK(cudaMalloc(&dref, (1 << 20) * 8));
    // copy ceiling: device-to-device copy of 1 GiB (read + write)
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    for (int i = 0; i < 3; ++i) cudaMemcpy(y, x, n * 4, cudaMemcpyDeviceToDevice);
    cudaEventRecord(a); for (int i = 0; i < 10; ++i) cudaMemcpy(y, x, n * 4, cudaMemcpyDeviceToDevice); cudaEventRecord(b);
    cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b);
    double copy = 2.0 * n * 4 * 10 / (ms * 1e6);
    printf("copy %.0f GB/s\n", copy);
    long long shapes[4][2] = {{256, 1 << 20}, {4096, 65536}, {65536, 4096}, {1 << 20, 256}};
    for (int bf16 = 1; bf16 >= 0; --bf16) {
        if (bf16) fill_bf<<<1024, 256>>>((unsigned short*)x, n, 7); else fill_f<<<1024, 256>>>((float*)x, n, 7);
        for (auto& s : shapes) {
            long long rows = s[0], cols = s[1];
            ref_sum<<<(cols + 255) / 256, 256>>>(x, bf16, rows, cols, dref);
            CK(cudaDeviceSynchronize());
            std::vector<double> ref(cols);
            CK(cudaMemcpy(ref.data(), dref, cols * 8, cudaMemcpyDeviceToHost));
            if (bf16) {
                typedef unsigned short T; const T* xx = (const T*)x; T* yy = (T*)y;
                run<T, 1, 8, 8, 1>("bf16", xx, yy, rows, cols, copy, ref);
                run<T, 1, 8, 8, 2>("bf16", xx, yy, rows, cols, copy, ref);
                run<T, 1, 8, 8, 4>("bf16", xx, yy, rows, cols, copy, ref);
                run_pairs<8, 8>(xx, yy, rows, cols, copy, ref);
                run<T, 2, 8, 8, 1>("bf16", xx, yy, rows, cols, copy, ref);
                run<T, 2, 8, 4, 1>("bf16", xx, yy, rows, cols, copy, ref);
                run<T, 4, 8, 4, 1>("bf16", xx, yy, rows, cols, copy, ref);
            } else {
                typedef float T; const T* xx = (const T*)x; T* yy = (T*)y;
                run<T, 1, 8, 8, 1>("f32", xx, yy, rows, cols, copy, ref);
                run<T, 2, 8, 4, 1>("f32", xx, yy, rows, cols, copy, ref);
            }
        }
    }
    return 0;
}
