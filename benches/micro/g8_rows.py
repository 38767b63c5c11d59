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
  `dy` into registers before this row's arithmetic (double-buffered in registers);
- `async2`, `async3` (item 150): each thread copies its vectors of the block's next row of `x`
  and `dy` into shared memory by `cp.async` before this row's arithmetic, two buffers a block,
  and reads this row's back from the other (a thread reads only what it copied: no barrier);
- `bias2`: the bias's vectors loaded once a thread before the rows, not once a row;
  `asyncb2`, `asyncb3`: both;
- `pack2` (item 151): `dx` rounded without the vector's NaN test (`fz_pack_bf16`'s form; its
  values are products, whose NaNs are canonical); `asyncbp2`: with `asyncb2`'s changes.
Every variant computes the same values (the outputs are compared with `base2`'s); `base2` runs
again last, as a check of the machine's drift. `python3 g8_rows.py DUMP DIR` also writes each
variant's CUDA C to `DIR/g8_<tag>.cu`."""
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
static __device__ __forceinline__ void cp_async8(void* dst, const void* src) {
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(s), "l"(src) : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
static __device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
static __device__ __forceinline__ fz_vec<unsigned short, 4> fz_pack4_bf16(const fz_vec<float, 4>& f) {
    union { fz_vec<unsigned short, 4> s; unsigned int w[2]; } u;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u.w[0]) : "f"(f.v[1]), "f"(f.v[0]));
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u.w[1]) : "f"(f.v[3]), "f"(f.v[2]));
    return u.s;
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


LOOP = "    for (long long g0 = blockIdx.x; g0 < groups; g0 += gridDim.x) {"
ROW_X = "        fz_vec<unsigned short, 4> rc_x[4];\n"


def copied_ahead(s):
    """The next row's `x` and `dy` copied into shared memory by `cp.async` while this row's
    arithmetic runs; this row's read back from the other buffer."""
    assert s.count(LOOP) == 1 and s.count(ROW_X) == 1

    def copies(buf, row, indent):
        return "".join(
            f"{indent}cp_async8(&fz_s{n}[{buf}][c], "
            f"reinterpret_cast<const unsigned long long*>({t} + {row}) + c);\n"
            for n, t in [("x", "p_x"), ("d", "p_d_out")])
    first = ("    __shared__ __align__(16) unsigned long long fz_sx[2][1024], fz_sd[2][1024];\n"
             "    int fz_buf = 0;\n"
             "    if (blockIdx.x < groups) {\n"
             "        #pragma unroll\n"
             "        for (int q = 0; q < 4; ++q) {\n"
             "            const int c = lane + q * width;\n"
             + copies("0", "(long long)blockIdx.x * d_h", " " * 12) +
             "        }\n"
             "    }\n"
             "    cp_async_commit();\n")
    s = s.replace(LOOP, first + LOOP)
    ahead = ("        if (g0 + gridDim.x < groups) {\n"
             "            #pragma unroll\n"
             "            for (int q = 0; q < 4; ++q) {\n"
             "                const int c = lane + q * width;\n"
             + copies("fz_buf ^ 1", "b0 + (long long)gridDim.x * d_h", " " * 16) +
             "            }\n"
             "        }\n"
             "        cp_async_commit();\n"
             "        cp_async_wait1();\n")
    s = s.replace(ROW_X, ahead + ROW_X)
    for t, r, n in [("p_x", "rc_x", "x"), ("p_d_out", "rc_d_out", "d")]:
        load = (f"{r}[q] = fz_ld_keep(reinterpret_cast<const fz_vec<unsigned short, 4>*>"
                f"({t} + b0) + c);")
        assert s.count(load) == 1, t
        s = s.replace(load, f"{r}[q] = *reinterpret_cast<const fz_vec<unsigned short, 4>*>"
                            f"(&fz_s{n}[fz_buf][c]);")
    # Flip the buffers once this row's vectors are read (after `dy`'s loop, before the math).
    tail = ("        #pragma unroll\n        for (int q = 0; q < 4; ++q) {\n"
            "            const int c = lane + q * width;\n            {\n"
            "                fz_vec<float, 4> s0;")
    assert s.count(tail) == 1
    return s.replace(tail, "        fz_buf ^= 1;\n" + tail)


def bias_once(s):
    """The bias's vectors loaded once a thread, before the rows."""
    load = ("const fz_vec<unsigned short, 4> lv_bias = fz_ld_keep(reinterpret_cast<const "
            "fz_vec<unsigned short, 4>*>(p_bias + b1) + lane + q * width);")
    assert s.count(load) == 1 and s.count(LOOP) == 1
    s = s.replace(load, "const fz_vec<unsigned short, 4> lv_bias = fz_bias_r[q];")
    first = ("    fz_vec<unsigned short, 4> fz_bias_r[4];\n"
             "    #pragma unroll\n"
             "    for (int q = 0; q < 4; ++q) fz_bias_r[q] = fz_ld_keep(reinterpret_cast<const "
             "fz_vec<unsigned short, 4>*>(p_bias) + lane + q * width);\n")
    return s.replace(LOOP, first + LOOP)


def packed(s):
    """`dx` rounded without the vector's NaN test: its values are products, whose NaNs are
    canonical (the `fz_pack_bf16` of map steps that load nothing, item 149)."""
    store = "fz_round_bf16(s0)"
    assert s.count(store) == 1
    return s.replace(store, "fz_pack4_bf16(s0)")


def variant(tag, blocks, ask_l2=False, plain=False, next_row=False, async_row=False,
            bias=False, pack=False):
    s = dump.replace(name.group(0), f"__launch_bounds__(256, {blocks}) g8_{tag}(")
    k = s.index('extern "C"')
    s = s[:k] + prefetch + s[k:]
    if ask_l2:
        assert s.count(anchor) == 1
        s = s.replace(anchor, ask + anchor)
    if next_row:
        s = ahead(s)
    if async_row:
        s = copied_ahead(s)
    if bias:
        s = bias_once(s)
    if pack:
        s = packed(s)
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
# (tag, blocks an SM, ask L2 for the next row, plain loads, next row in registers, next row
# copied into shared memory, bias loaded once, `dx` rounded without a NaN test)
cases = [("base2", 2, False, False, False, False, False),
         ("base3", 3, False, False, False, False, False),
         ("base4", 4, False, False, False, False, False),
         ("pf2", 2, True, False, False, False, False),
         ("pf3", 3, True, False, False, False, False),
         ("ldg2", 2, False, True, False, False, False),
         ("next2", 2, False, False, True, False, False),
         ("next3", 3, False, False, True, False, False),
         ("async2", 2, False, False, False, True, False),
         ("async3", 3, False, False, False, True, False),
         ("bias2", 2, False, False, False, False, True),
         ("asyncb2", 2, False, False, False, True, True),
         ("asyncb3", 3, False, False, False, True, True),
         ("pack2", 2, False, False, False, False, False, True),
         ("asyncbp2", 2, False, False, False, True, True, True),
         ("base2", 2, False, False, False, False, False)]
if len(sys.argv) > 2:
    for tag, *rest in cases:
        open(f"{sys.argv[2]}/g8_{tag}.cu", "w").write(variant(tag, *rest))
for tag, blocks, *rest in cases:
    code = variant(tag, blocks, *rest)
    mod = cp.RawModule(code=code, options=("--std=c++17",))
    t = timed(mod.get_function(f"g8_{tag}"), blocks * sms)
    ref = ref or t
    unlike = int((t[2] != ref[2]).sum()) + int((t[3] != ref[3]).sum())
    print(f"{tag:6s} grid {blocks * sms:4d}: {t[0]:.1f} us (median {t[1]:.1f}), "
          f"{nbytes / t[0] / 1e3:.0f} GB/s, outputs unlike base2's: {unlike}")
