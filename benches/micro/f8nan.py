"""NOTES.md items 144-145: `python3 benches/micro/f8nan.py` on the GPU machine prints what the
pair conversions `cvt.rn.satfinite.e4m3x2.f32` and `.e5m2x2.f32` make of NaNs (the canonical
0x7fffffff, others, negative ones), infinities, the largest values and a signed zero, beside the
NaN that the GPU's own arithmetic makes (0 / 0). `fz_pack_f8e4m3` and `fz_pack_f8e5m2` round two
values an instruction without a NaN test where the values' NaNs are canonical: that holds only
if the canonical NaN comes out as `0x7f`, the byte the CPU backend makes of every NaN. On an
H100 (item 145) every NaN came out `0x7f` from both, the infinities the largest finite values
(`0x7e`, `0x7b`), and 0 / 0 was the canonical NaN."""
import cupy as cp
import numpy as np

src = r'''
extern "C" __global__ void k(const unsigned int* x, unsigned short* e4, unsigned short* e5,
                             unsigned int* q, int n) {
    const int i = threadIdx.x;
    if (2 * i + 1 >= n) return;
    const float a = __uint_as_float(x[2 * i]), b = __uint_as_float(x[2 * i + 1]);
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
    e4[i] = r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
    e5[i] = r;
    const float z = a - a;
    q[i] = __float_as_uint(z / z);
}'''
bits = lambda v: int(np.float32(v).view(np.uint32))
vals = [0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F800000, 0xFF800000,
        bits(448), bits(500), bits(-1e9), bits(1.5), bits(-0.0)]
n = len(vals)
x = cp.asarray(np.array(vals, dtype=np.uint32))
e4, e5 = cp.zeros(n // 2, cp.uint16), cp.zeros(n // 2, cp.uint16)
q = cp.zeros(n // 2, cp.uint32)
cp.RawModule(code=src).get_function("k")((1,), (32,), (x, e4, e5, q, np.int32(n)))
print("a        b        | e4m3 of a, b | e5m2 of a, b | (a - a) / (a - a)")
for i in range(n // 2):
    a4, a5 = int(e4[i]), int(e5[i])
    print(f"{vals[2 * i]:08x} {vals[2 * i + 1]:08x} | {a4 & 0xFF:02x} {a4 >> 8:02x}        | "
          f"{a5 & 0xFF:02x} {a5 >> 8:02x}        | {int(q[i]):08x}")
