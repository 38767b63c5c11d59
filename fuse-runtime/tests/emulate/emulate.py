"""Runs one kernel of fuse!'s generated CUDA C on the CPU: compiles it with g++ against shim.h (each
CUDA thread a std::thread, the blocks of a cluster at once, clusters one after another), feeds it
the inputs of a JSON spec and prints the outputs' bytes. The spec's optional "cluster" (blocks per
cluster, default 1) and "smem" (dynamic shared bytes per block, default 0) shape the launch as the
runtime does for long rows; "grid" is the number of clusters (default 3); "wide" makes the vector
loops take their 64-bit indices. Used by
tests/emulated.rs; usage: emulate.py SPEC BUILD_DIR."""
import json, re, subprocess, sys, os, hashlib, struct
spec = json.load(open(sys.argv[1]))
src = spec["source"]
src = re.sub(r'static __device__ __forceinline__ float fz_f16_to_f32\(unsigned short h\) \{[^\n]*\n',
  'static inline float fz_f16_to_f32(unsigned short h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }\n', src)
src = re.sub(r'static __device__ __forceinline__ unsigned short fz_f32_to_f16\(float f\) \{[^\n]*\n',
  'static inline unsigned short fz_f32_to_f16(float f) { _Float16 g = (_Float16)f; unsigned short h; std::memcpy(&h, &g, 2); return h; }\n', src)
# A template on the block's rank in its cluster: each instance has its own statics (__shared__).
src = src.replace('extern "C" __global__', 'template <int fz_rank> static')
# With "wide", the vector loops take their 64-bit indices, as for 2^32 vectors and more.
if spec.get("wide"):
    small = "const bool small = nv + js <= 0xffffffffll;"
    assert small in src, "wide: the source has no loop with 32-bit indices"
    src = src.replace(small, "const bool small = false;")
# The kernel to run, as the runtime picks it: the entry point for short rows when the source
# has one and the rows are 1 to 32 elements long; the one for long rows when the spec gives
# dynamic shared memory (the runtime gives it that entry only); else the source's first kernel.
entry = r"\w+"
short = re.search(r"static\s+void\s+__launch_bounds__\([^)]*\)\s+(\w+_short_rows)\s*\(\n.*?\n\)\s*\{\n\s*__shared__[^\n]*\n\s*const long long len = (?:d_(\w+)|(\d+));", src, re.S)
if short:
    length = spec["dims"][short.group(2)] if short.group(2) else int(short.group(3))
    if 1 <= length <= 32:
        entry = short.group(1)
if spec.get("smem", 0) > 0:
    entry = r"\w+_long_rows"
m = re.search(r"static\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(" + entry + r")\s*\(\n(.*?)\n\)\s*\{", src, re.S)
name, plist = m.group(1), m.group(2)
params = []
for line in plist.split('\n'):
    line = line.strip().rstrip(',')
    pm = re.match(r'(const\s+)?(.*?)(\*)?\s*(__restrict__\s+)?(\w+)$', line)
    const, ty, ptr, _, pname = pm.groups()
    params.append((ty.strip(), bool(ptr), pname))
tens, outs, scal, dims = list(spec["tensors"]), list(spec["outputs"]), list(spec["scalars"]), dict(spec["dims"])
decl, args, load, post = [], [], [], []
# The dynamic shared memory comes first in the input, so one build serves every size.
blob = struct.pack("<Q", spec.get("smem", 0))
ti = oi = si = di = 0
scalars = {}
u64 = lambda v: struct.pack("<Q", v)
for ty, ptr, pname in params:
    if pname == "fz_scratch":
        decl.append("static unsigned long long scratch[1<<16];"); args.append("scratch"); continue
    if pname == "fz_counter":
        decl.append("static unsigned int counter = 0;"); args.append("&counter"); continue
    if ptr:
        decl.append(f"static unsigned char* {pname}_b; static unsigned long long {pname}_n;")
        # With "misalign", each buffer starts one element past a 64-byte boundary.
        shift = f"sizeof({ty})" if spec.get("misalign") else "0"
        load.append(f"{pname}_n = rd(); {pname}_b = (unsigned char*)aligned_alloc(64, ({pname}_n + 128) / 64 * 64) + {shift}; ")
        if pname.startswith("p_"):
            b = bytes.fromhex(tens[ti]); ti += 1
            blob += u64(len(b)) + b
            load.append(f"fread({pname}_b, 1, {pname}_n, f);")
        else:
            blob += u64(outs[oi]); oi += 1
            load.append(f"memset({pname}_b, 0xff, {pname}_n);")
            post.append(f'fwrite({pname}_b, 1, {pname}_n, stdout);')
        load.append(f"g_buffers.push_back({{{pname}_b, {pname}_n}});")
        args.append(f"({ty}*){pname}_b")
    elif pname.startswith("fz_recip_"):
        # An elementwise kernel's divisor, whose reciprocal the runtime computes: evaluate the
        # divisor the source initializes with it, `{(unsigned long long)(SIZE) / BY, NAME}`.
        dm = re.search(r"\{\(unsigned long long\)\(?(.*?)\)?(?: / (\d+))?, " + pname + r"\}", src)
        d = eval(dm.group(1), {}, {f"d_{k}": v for k, v in dims.items()}) // int(dm.group(2) or 1)
        blob += u64((2**64 - 1) // d if d else 0)
        decl.append(f"static unsigned long long {pname}_v;"); load.append(f"{pname}_v = rd();")
        args.append(f"{pname}_v")
    elif pname.startswith("fz_key"):
        # Philox's round key i of the j-th seed parameter, which the runtime computes: the seed is
        # the parameter of the value the source's `{{v<id>, fz_key<j>_1, ...}}` starts from.
        j, i = map(int, pname[len("fz_key"):].split("_"))
        v = re.search(r"\{\{v(\d+), fz_key" + str(j) + r"_1,", src).group(1)
        seed = scalars[re.search(r"const unsigned long long v" + v + r" = (p_\w+);", src).group(1)]
        k0 = (seed + i * 0x9E3779B9) % 2**32
        k1 = ((seed >> 32) + i * 0xBB67AE85) % 2**32
        blob += u64(k1 << 32 | k0)
        decl.append(f"static unsigned long long {pname}_v;"); load.append(f"{pname}_v = rd();")
        args.append(f"{pname}_v")
    elif pname.startswith("d_"):
        blob += u64(dims[pname[2:]])
        decl.append(f"static long long {pname}_v;"); load.append(f"{pname}_v = (long long)rd();")
        args.append(f"{pname}_v")
    else:
        scalars[pname] = scal[si]
        blob += u64(scal[si]); si += 1
        decl.append(f"static {ty} {pname}_v;")
        load.append(f"{{ unsigned long long bits = rd(); std::memcpy(&{pname}_v, &bits, sizeof({pname}_v)); }}")
        args.append(f"{pname}_v")
grid, cluster = spec.get("grid", 3), spec.get("cluster", 1)
instances = ", ".join(f"&{name}<{r}>" for r in range(cluster))
main = "\n".join(decl) + f"""
static FILE* f;
static unsigned long long rd() {{ unsigned long long v; fread(&v, 8, 1, f); return v; }}
int main(int argc, char** argv) {{
  f = fopen(argv[1], "rb");
  const unsigned int smem = (unsigned int)rd();
  {" ".join(load)}
  using kernel_t = decltype(&{name}<0>);
  const kernel_t kernels[{cluster}] = {{{instances}}};
  gridDim.x = {grid} * {cluster};
  for (unsigned k = 0; k < {grid}; ++k) {{
    std::barrier<> all(256 * {cluster});
    fz_cluster_state cl{{&all, {{}}, {cluster}}};
    for (unsigned r = 0; r < {cluster}; ++r) {{
      fz_block_state* b = new fz_block_state();
      for (int w = 0; w < 8; ++w) b->warp[w] = new std::barrier<>(32);
      b->smem_bytes = smem;
      b->smem = (unsigned char*)aligned_alloc(64, (smem + 64) / 64 * 64);
      memset(b->smem, 0xa5, smem);
      cl.blocks[r] = b;
    }}
    std::vector<std::thread> ts;
    for (unsigned r = 0; r < {cluster}; ++r)
      for (unsigned t = 0; t < 256; ++t)
        ts.emplace_back([=, &cl] {{ threadIdx = {{t,0,0}}; blockIdx = {{k * {cluster} + r,0,0}}; g_blk = cl.blocks[r]; g_cl = &cl; kernels[r]({", ".join(args)}); }});
    for (auto& th : ts) th.join();
    for (unsigned r = 0; r < {cluster}; ++r) {{
      for (int w = 0; w < 8; ++w) delete cl.blocks[r]->warp[w];
      free(cl.blocks[r]->smem); delete cl.blocks[r];
    }}
  }}
  if (g_used_shared) fprintf(stderr, "emulate: rows cached in shared memory\\n");
  {" ".join(post)}
  return 0;
}}
"""
shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'shim.h')
code = f'#include "{shim}"\n' + src + main
key = hashlib.sha1(code.encode() + open(shim, 'rb').read()).hexdigest()[:16]
build = sys.argv[2]
exe = os.path.join(build, key)
os.makedirs(build, exist_ok=True)
if not os.path.exists(exe):
    # Built under a name of this process's own and renamed when complete: tests running at
    # the same time may build the same kernel, and must not run a half-written binary.
    tmp = f"{exe}.{os.getpid()}"
    cpp = tmp + ".cpp"
    open(cpp, "w").write(code)
    r = subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-w", "-o", tmp, cpp, "-lpthread"], capture_output=True, text=True)
    if r.returncode:
        sys.stderr.write(r.stderr[:4000]); sys.exit(2)
    os.replace(tmp, exe)
inp = sys.argv[1] + ".bin"
open(inp, "wb").write(blob)
r = subprocess.run([exe, inp], capture_output=True, timeout=900)
if r.returncode:
    sys.stderr.write("run failed %d %s\n" % (r.returncode, r.stderr[:2000])); sys.exit(3)
sys.stderr.buffer.write(r.stderr)
sys.stdout.buffer.write(r.stdout)
