// A CPU stand-in for the CUDA runtime pieces fuse!'s kernels use: each CUDA thread is a
// std::thread. The blocks of a cluster run at once, clusters one after another; emulate.py makes
// the kernel a template on the block's rank in its cluster, so that `static` (standing in for
// __shared__) gives each block of a cluster its own copy.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <barrier>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include <atomic>
#include <algorithm>
#include <cstdlib>
#include <utility>
#include <type_traits>
using std::isnan; using std::isinf; using std::isfinite; using std::signbit;
// CUDA's fmax and fmin (PTX max and min) give the other operand where one is NaN, signaling NaN
// included, as Rust's f32::max does; glibc's give NaN for a signaling one.
template <typename T> static inline T fz_emu_max(T a, T b) { return isnan(a) ? b : isnan(b) ? a : std::fmax(a, b); }
template <typename T> static inline T fz_emu_min(T a, T b) { return isnan(a) ? b : isnan(b) ? a : std::fmin(a, b); }
#define fmaxf fz_emu_max<float>
#define fminf fz_emu_min<float>
#define fmax fz_emu_max<double>
#define fmin fz_emu_min<double>
struct dim3_ { unsigned int x, y, z; };
static thread_local dim3_ threadIdx, blockIdx;
static dim3_ blockDim{256,1,1}, gridDim{1,1,1};
// One block: its barriers, the words its warps exchange, its dynamic shared memory, and its
// slots of a cluster's exchange (`fz_xs`, which each block declares).
struct fz_block_state { std::barrier<> block{256}; std::barrier<>* warp[8]; unsigned long long xchg[256];
  unsigned char* smem = nullptr; unsigned int smem_bytes = 0; unsigned char* xs = nullptr;
  std::mutex named_lock; std::unique_ptr<std::barrier<>> named[16]; };
// One cluster: a barrier over all its threads and its blocks, by rank.
struct fz_cluster_state { std::barrier<>* all; fz_block_state* blocks[16]; unsigned int size; };
static thread_local fz_block_state* g_blk;
static thread_local fz_cluster_state* g_cl;
static std::atomic<bool> g_used_shared{false};
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __constant__
#define __launch_bounds__(...)
static inline void __syncthreads() { g_blk->block.arrive_and_wait(); }
// A named barrier (`bar.sync id, n`) of a row's segment: the first of its threads to arrive
// makes it, for `n` threads, so that the block's other segments go on without it.
static inline void fz_row_sync(unsigned int s, int n) {
  std::barrier<>* b; { std::lock_guard<std::mutex> g(g_blk->named_lock);
    if (!g_blk->named[s + 1]) g_blk->named[s + 1] = std::make_unique<std::barrier<>>(n); b = g_blk->named[s + 1].get(); }
  b->arrive_and_wait(); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int off) {
  unsigned t = threadIdx.x; unsigned long long bits = 0; static_assert(sizeof(T) <= 8);
  std::memcpy(&bits, &v, sizeof(T)); g_blk->warp[t / 32]->arrive_and_wait(); g_blk->xchg[t] = bits;
  g_blk->warp[t / 32]->arrive_and_wait(); unsigned long long o = g_blk->xchg[(t & ~31u) | ((t & 31u) ^ (unsigned)off)];
  g_blk->warp[t / 32]->arrive_and_wait(); T r; std::memcpy(&r, &o, sizeof(T)); return r; }
// The long-row helpers (`fz_long_rows`, which the generated CUDA C defines for the GPU only):
// dynamic shared memory, copies, and the cluster's barrier and exchange. The exchange writes
// into the other blocks' slots at once and waits at a barrier of the whole cluster, where the
// GPU counts each block's arrivals on a transaction barrier of its own.
static inline unsigned char* fz_shared() { g_used_shared = true; return g_blk->smem; }
static inline unsigned int fz_smem_bytes() { return g_blk->smem_bytes; }
template <int N> static inline void fz_copy_async(void* dst, const void* src) { std::memcpy(dst, src, N); }
static inline void fz_copy_wait() {}
// The L2 prefetch is only a hint on the GPU; here it checks that the range lies in one of the
// kernel's buffers (emulate.py lists them), so that a wrong next-row address fails the test.
static std::vector<std::pair<const unsigned char*, unsigned long long>> g_buffers;
static inline void fz_prefetch_l2(const void* from, long long bytes) {
  if (bytes <= 0) return; const unsigned char* p = (const unsigned char*)from;
  for (auto& [b, n] : g_buffers) if (p >= b && p + bytes <= b + n) return;
  fprintf(stderr, "emulate: prefetch of %lld bytes outside every buffer\n", bytes); std::abort(); }
static inline unsigned int fz_cluster_size() { return g_cl->size; }
static inline void fz_cluster_exit() { g_cl->all->arrive_and_wait(); }
static inline void fz_exchange_init(unsigned long long*, unsigned long long* xs) {
  if (threadIdx.x == 0) g_blk->xs = (unsigned char*)xs; g_cl->all->arrive_and_wait(); }
static inline void fz_expect(unsigned long long*, unsigned int) {}
template <typename T> static inline void fz_send(unsigned long long* slot, T value, unsigned long long*, unsigned int to) {
  unsigned long long u = 0; std::memcpy(&u, &value, sizeof(T));
  std::memcpy(g_cl->blocks[to]->xs + ((unsigned char*)slot - g_blk->xs), &u, 8); }
static inline void fz_wait(unsigned long long*, unsigned int& parity, unsigned int phase) {
  parity ^= 1u << phase; g_cl->all->arrive_and_wait(); }
template <typename T> static inline T fz_take(const unsigned long long* slot) { T v; std::memcpy(&v, slot, sizeof(T)); return v; }
// The row-a-block loop's bulk copy of the next row, by thread 0: copied at once, and seen by
// the block's other threads after the barrier where the GPU waits for its bytes.
static inline void fz_row_barriers(unsigned long long*) {}
static inline void fz_copy_row(void* dst, const void* src, unsigned int bytes, unsigned long long*) { std::memcpy(dst, src, bytes); }
static inline void fz_copy_bulk(void* dst, const void* src, unsigned int bytes, unsigned long long*) { std::memcpy(dst, src, bytes); }
static inline void fz_row_wait(unsigned long long*, unsigned int& parity, unsigned int phase) { parity ^= 1u << phase; __syncthreads(); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
// The grid's barrier (fz_grid_sync in the CUDA text), for a grid run "together": counter 0
// counts the blocks that arrived, counter 1 those past, the last of which zeroes both.
static inline void fz_grid_sync(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __atomic_fetch_add(counter, 1u, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(counter, __ATOMIC_SEQ_CST) < gridDim.x) std::this_thread::yield();
    if (__atomic_fetch_add(counter + 1, 1u, __ATOMIC_SEQ_CST) == gridDim.x - 1) {
      __atomic_store_n(counter, 0u, __ATOMIC_SEQ_CST); __atomic_store_n(counter + 1, 0u, __ATOMIC_SEQ_CST); }
  }
  __syncthreads(); }
template <typename T> static inline T __ldcg(const T* p) { return *p; }
static inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline double __longlong_as_double(long long i) { double f; std::memcpy(&f, &i, 8); return f; }
static inline long long __double_as_longlong(double f) { long long i; std::memcpy(&i, &f, 8); return i; }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) { return (unsigned long long)(((__uint128_t)a * b) >> 64); }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline float __uint2float_rn(unsigned a) { return (float)a; }
static inline float __int2float_rn(int a) { return (float)a; }
static inline int __popc(unsigned a) { return __builtin_popcount(a); }
static inline int __popcll(unsigned long long a) { return __builtin_popcountll(a); }
static inline int __clz(int a) { return a == 0 ? 32 : __builtin_clz((unsigned)a); }
static inline int __clzll(long long a) { return a == 0 ? 64 : __builtin_clzll((unsigned long long)a); }
static inline int __ffs(int a) { return __builtin_ffs(a); }
static inline int __ffsll(long long a) { return __builtin_ffsll(a); }
template <typename I, typename F> static inline I sat(F x) { if (x != x) return 0; F t = std::trunc(x);
  if (t <= (F)std::numeric_limits<I>::min()) return std::numeric_limits<I>::min();
  if (t >= (F)std::numeric_limits<I>::max()) return std::numeric_limits<I>::max(); return (I)t; }
#define CV(src, S, dst, D) static inline D __##src##2##dst##_rz(S x) { return sat<D, S>(x); }
CV(float, float, int, int) CV(float, float, uint, unsigned) CV(float, float, ll, long long) CV(float, float, ull, unsigned long long)
CV(double, double, int, int) CV(double, double, uint, unsigned) CV(double, double, ll, long long) CV(double, double, ull, unsigned long long)
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __log10f(x) log10f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(x, y) powf(x, y)
// Calls kernel `f` with its parameters read from 8-byte argument slots, as the driver reads a
// launch's: a pointer is the slot's address, a scalar the slot's low bytes.
template <typename T> static inline T fz_from_slot(unsigned long long slot) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(slot);
  } else {
    std::remove_const_t<T> value;
    std::memcpy(&value, &slot, sizeof(value));
    return value;
  }
}
template <typename... A, std::size_t... I>
static inline void fz_call_at(void (*f)(A...), const unsigned long long* slots, std::index_sequence<I...>) {
  f(fz_from_slot<A>(slots[I])...);
}
template <typename... A>
static inline void fz_call(void (*f)(A...), const unsigned long long* slots) {
  fz_call_at(f, slots, std::index_sequence_for<A...>{});
}
