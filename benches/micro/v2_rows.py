"""NOTES.md item 143: `python3 benches/micro/v2_rows.py DUMP` on the GPU machine times V2's
row-a-block entry as fuse writes it (DUMP: `fuse_v2_rmsnorm_fp8_exact_rows.cu`, written by
`FUSE_DUMP_DIR=DIR FUSE_DUMP_ONLY=1 cargo test --release -p fuse-runtime --test nvrtc_kernels`)
beside the hand-written variants of `v2_rows.cu`, with CuPy and CUDA events, on the benchmark's
8192 x 4096 bf16 rows; each variant's outputs are compared with fuse's (the variants of 256
threads a row and four elements a vector sum in fuse's order, so theirs are equal)."""
import os
import re
import sys

import cupy as cp
import numpy as np
from event_times import event_times

T, H = 8192, 4096
here = os.path.dirname(os.path.abspath(__file__))
dump = open(sys.argv[1]).read()
preamble = dump[: dump.index('extern "C"')]
hand_src = preamble + open(os.path.join(here, "v2_rows.cu")).read()
rng = cp.random.default_rng(7)


def bf16(a):
    return (a.astype(cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)


x = bf16(rng.standard_normal((T, H), dtype=cp.float32))
w = bf16(1.0 + 0.1 * rng.standard_normal(H, dtype=cp.float32))
nbytes = 3 * T * H + 4 * T


def timed(f, grid):
    q, s = cp.empty((T, H), cp.uint8), cp.empty(T, cp.float32)
    args = (x, w, q, s, np.int64(T), np.int64(H))
    best, median = event_times(lambda: f((grid,), (256,), args), 200, warmup=20)
    return best, median, q, s


y = cp.empty_like(x)


def copy():
    y[...] = x


us, _ = event_times(copy, 200, rounds=1)
print(f"copy of x, {2 * T * H} bytes: {us:.2f} us, {2 * T * H / us / 1e3:.0f} GB/s")
fuse = cp.RawModule(code=dump, options=("--std=c++17",))
ref = timed(fuse.get_function("fuse_v2_rmsnorm_fp8_exact_rows"), T)
print(f"fuse exact_rows, grid {T}: {ref[0]:.2f} us (median {ref[1]:.2f}), "
      f"{nbytes / ref[0] / 1e3:.0f} GB/s")
hand = cp.RawModule(code=hand_src, options=("--std=c++17",))
for name, width in re.findall(r"^V2K\((\w+), (\d+),", hand_src, re.M):
    grid = T // (256 // int(width))
    t = timed(hand.get_function(name), grid)
    dq, ds = int((t[2] != ref[2]).sum()), int((t[3] != ref[3]).sum())
    print(f"{name:14s} grid {grid:5d}: {t[0]:.2f} us (median {t[1]:.2f}), "
          f"{nbytes / t[0] / 1e3:.0f} GB/s, outputs unlike fuse's: q {dq}, s {ds}")
