"""NOTES.md item 143: `python3 benches/micro/g8_rows.py DUMP` on the GPU machine times G8's
backward (`d0_exact_rows` of `g8_bias_gelu_dropout`: dx of bias + GELU + dropout, the mask drawn
again, beside dbias's partial sums; DUMP is that entry's CUDA C as `FUSE_DUMP_DIR` writes it,
see `v2_rows.py`) and variants made from its text, with CuPy and CUDA events, on the
benchmark's 16384 x 4096 bf16 rows, at the grid of resident blocks the runtime gives it
(`Grid::Parts`: its blocks an SM times the SMs):
- `base2`, `base3`, `base4`: `__launch_bounds__(256, 2)` (fuse's), `(256, 3)` (reverted in item
  143) and `(256, 4)` (item 146, after `gelu`'s derivative left G8's entry at 95 registers);
- `pf2`, `pf3`: each block asks L2 for its next row of `x` and `dy` (`fz_prefetch_l2`);
- `ldg2`: `x` and `dy` loaded by `ld.global` where ptxas made them `ld.global.nc`;
- `next2`, `next3` (item 146): each thread loads its vectors of the block's next row of `x` and
  `dy` into registers before this row's arithmetic (double-buffered in registers).
Every variant computes the same values (the outputs are compared with `base2`'s)."""
import re
import sys

import cupy as cp
import numpy as np
from event_times import event_times

T, H = 16384, 4096
dump = open(sys.argv[1]).read()
name = re.search(r"__launch_bounds__\(256, (\d)\) (\w+)\(", dump)
entry = name.group(2)
prefetch = r'''#ifdef __CUDA_ARCH__
static __device__ __forceinline__ void fz_prefetch_l2(const void* from, long long bytes) {
    const unsigned long long start = (unsigned long long)__cvta_generic_to_global(from);
    const unsigned long long first = (start + 15) & ~15ull, last = (start + bytes) & ~15ull;
    if (threadIdx.x == 0 && last > first) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(first), "r"((unsigned int)(last - first)));
}
#endif
static __device__ __forceinline__ fz_vec<unsigned short, 4> ld_plain4(const fz_vec<unsigned short, 4>* p) {
    union { fz_vec<unsigned short, 4> v; unsigned int w[2]; } u;
    asm("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(u.w[0]), "=r"(u.w[1]) : "l"(p));
    return u.v;
}
'''
anchor = '''        #pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int c = lane + q * width;
            {
                fz_vec<float, 4> s0;'''
ask = '''        if (g0 + gridDim.x < groups) {
            fz_prefetch_l2(p_x + b0 + (long long)gridDim.x * len, len * (long long)sizeof(unsigned short));
            fz_prefetch_l2(p_d_out + b0 + (long long)gridDim.x * len, len * (long long)sizeof(unsigned short));
        }
'''


def ahead(s):
    """The next row's `x` and `dy` loaded into registers before this row's arithmetic."""
    for t, r in [("p_x", "rc_x"), ("p_d_out", "rc_d_out")]:
        load = f"{r}[q] = fz_ld_keep(reinterpret_cast<const fz_vec<unsigned short, 4>*>({t} + b0) + c);"
        assert s.count(load) == 1, t
        nxt = (f"{r}[q] = nx_{r}[q]; if (g0 + gridDim.x < groups) nx_{r}[q] = fz_ld_keep("
               f"reinterpret_cast<const fz_vec<unsigned short, 4>*>({t} + b0 + (long long)gridDim.x * d_h) + c);")
        s = s.replace(load, nxt)
    loop = "    for (long long g0 = blockIdx.x; g0 < groups; g0 += gridDim.x) {"
    assert s.count(loop) == 1
    first = ("    fz_vec<unsigned short, 4> nx_rc_x[4], nx_rc_d_out[4];\n"
             "    if (blockIdx.x < groups) {\n"
             "        #pragma unroll\n"
             "        for (int q = 0; q < 4; ++q) {\n"
             "            const int c = lane + q * width;\n"
             "            nx_rc_x[q] = fz_ld_keep(reinterpret_cast<const fz_vec<unsigned short, 4>*>(p_x + blockIdx.x * d_h) + c);\n"
             "            nx_rc_d_out[q] = fz_ld_keep(reinterpret_cast<const fz_vec<unsigned short, 4>*>(p_d_out + blockIdx.x * d_h) + c);\n"
             "        }\n"
             "    }\n")
    return s.replace(loop, first + loop)


def variant(tag, blocks, ask_l2=False, plain=False, next_row=False):
    s = dump.replace(name.group(0), f"__launch_bounds__(256, {blocks}) g8_{tag}(")
    k = s.index('extern "C"')
    s = s[:k] + prefetch + s[k:]
    if ask_l2:
        assert s.count(anchor) == 1
        s = s.replace(anchor, ask + anchor)
    if next_row:
        s = ahead(s)
    if plain:
        for t in ["p_x", "p_d_out"]:
            load = f"fz_ld_keep(reinterpret_cast<const fz_vec<unsigned short, 4>*>({t} + b0) + c)"
            assert s.count(load) == 1, t
            s = s.replace(load, load.replace("fz_ld_keep", "ld_plain4"))
    return s


rng = cp.random.default_rng(8)


def bf16(a):
    return (a.astype(cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)


x = bf16(rng.standard_normal((T, H), dtype=cp.float32))
bias = bf16(0.1 * rng.standard_normal(H, dtype=cp.float32))
dy = bf16(rng.standard_normal((T, H), dtype=cp.float32))
sms = cp.cuda.Device().attributes["MultiProcessorCount"]
keys = [np.uint64(0x9E3779B97F4A7C15 * i % (1 << 64)) for i in range(1, 10)]
nbytes = 6 * T * H


def timed(f, grid):
    dx, db = cp.empty((T, H), cp.uint16), cp.empty(H, cp.uint16)
    scratch = cp.zeros(grid * H // 2 + 8, cp.uint64)
    counter = cp.zeros(2, cp.uint32)
    args = (x, bias, dy, dx, db, np.uint64(0x5EED), np.int64(T), np.int64(H), *keys, scratch,
            counter)
    best, median = event_times(lambda: f((grid,), (256,), args), 50, warmup=5)
    return best, median, dx, db


ref = None
# (tag, blocks an SM, ask L2 for the next row, plain loads, next row in registers)
cases = [("base2", 2, False, False, False), ("base3", 3, False, False, False),
         ("base4", 4, False, False, False), ("pf2", 2, True, False, False),
         ("pf3", 3, True, False, False), ("ldg2", 2, False, True, False),
         ("next2", 2, False, False, True), ("next3", 3, False, False, True)]
for tag, blocks, ask_l2, plain, next_row in cases:
    code = variant(tag, blocks, ask_l2, plain, next_row)
    mod = cp.RawModule(code=code, options=("--std=c++17",))
    t = timed(mod.get_function(f"g8_{tag}"), blocks * sms)
    ref = ref or t
    unlike = int((t[2] != ref[2]).sum()) + int((t[3] != ref[3]).sum())
    print(f"{tag:6s} grid {blocks * sms:4d}: {t[0]:.1f} us (median {t[1]:.1f}), "
          f"{nbytes / t[0] / 1e3:.0f} GB/s, outputs unlike base2's: {unlike}")
