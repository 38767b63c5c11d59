"""Runs one entry point of fuse!'s generated CUDA C on the CPU: compiles it with g++ against shim.h
(each CUDA thread a std::thread, the blocks of a cluster at once, clusters one after another, or
every block at once with "together"),
fills its argument slots from a JSON spec ("entry", "slots") and prints the outputs' bytes. The spec's optional "cluster" (blocks per
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
# The entry to run and its argument slots come from the kernel's program (tests/emulated.rs
# picks the entry as the runtime does and fills each slot as the runtime would): buffers are
# allocated here, every other slot is its 8-byte value. The kernel's parameters are read from
# their slots as the driver reads them (fz_call in shim.h), so nothing here parses the source.
name = spec["entry"]
slots = spec["slots"]
decl, load, post = [f"static unsigned long long slots[{max(len(slots), 1)}];"], [], []
# Buffers written in place ("inout", a `&mut` parameter): read in, printed after the outputs in
# the order of their "id"; the slots of several writes through one share its buffer.
inout, inout_post = {}, {}
# The dynamic shared memory comes first in the input, so one build serves every size.
blob = struct.pack("<Q", spec.get("smem", 0))
u64 = lambda v: struct.pack("<Q", v)
for i, slot in enumerate(slots):
    kind = slot["kind"]
    if kind == "scratch":
        decl.append("static unsigned long long scratch[1<<22];"); load.append(f"slots[{i}] = (unsigned long long)scratch;"); continue
    if kind == "counter":
        decl.append("static unsigned int counter[1 << 12];"); load.append(f"slots[{i}] = (unsigned long long)counter;"); continue
    if kind == "inout" and slot["id"] in inout:
        load.append(f"slots[{i}] = slots[{inout[slot['id']]}];"); continue
    if kind in ("in", "out", "inout"):
        b = f"buf{i}"
        decl.append(f"static unsigned char* {b}_b; static unsigned long long {b}_n;")
        # With "misalign", each buffer starts one element past a 64-byte boundary.
        shift = slot["elem"] if spec.get("misalign") else 0
        load.append(f"{b}_n = rd(); {b}_b = (unsigned char*)aligned_alloc(64, ({b}_n + 128) / 64 * 64) + {shift}; ")
        if kind in ("in", "inout"):
            data = bytes.fromhex(slot["data"])
            blob += u64(len(data)) + data
            load.append(f"fread({b}_b, 1, {b}_n, f);")
            if kind == "inout":
                inout[slot["id"]] = i
                inout_post[slot["id"]] = f'fwrite({b}_b, 1, {b}_n, stdout);'

        else:
            blob += u64(slot["bytes"])
            load.append(f"memset({b}_b, 0xff, {b}_n);")
            post.append(f'fwrite({b}_b, 1, {b}_n, stdout);')
        load.append(f"g_buffers.push_back({{{b}_b, {b}_n}});")
        load.append(f"slots[{i}] = (unsigned long long){b}_b;")
    else:
        blob += u64(slot["value"])
        load.append(f"slots[{i}] = rd();")
post += [inout_post[k] for k in sorted(inout_post)]
grid, cluster = spec.get("grid", 3), spec.get("cluster", 1)
# With "together", every block of the grid runs at once, as a cooperative launch keeps them
# (kernels with a barrier of the grid); else a cluster at a time.
together = spec.get("together", False)
waves, per = (1, grid * cluster) if together else (grid, cluster)
instances = ", ".join(f"&{name}<{r}>" for r in range(per))
main = "\n".join(decl) + f"""
static FILE* f;
static unsigned long long rd() {{ unsigned long long v; fread(&v, 8, 1, f); return v; }}
int main(int argc, char** argv) {{
  f = fopen(argv[1], "rb");
  const unsigned int smem = (unsigned int)rd();
  {" ".join(load)}
  using kernel_t = decltype(&{name}<0>);
  const kernel_t kernels[{per}] = {{{instances}}};
  gridDim.x = {grid} * {cluster};
  for (unsigned k = 0; k < {waves}; ++k) {{
    std::vector<std::unique_ptr<std::barrier<>>> alls;
    std::vector<fz_cluster_state> cls({per} / {cluster});
    for (unsigned c = 0; c < {per} / {cluster}; ++c) {{
      alls.push_back(std::make_unique<std::barrier<>>(256 * {cluster}));
      cls[c] = fz_cluster_state{{alls.back().get(), {{}}, {cluster}}};
    }}
    std::vector<fz_block_state*> blocks;
    for (unsigned r = 0; r < {per}; ++r) {{
      fz_block_state* b = new fz_block_state();
      for (int w = 0; w < 8; ++w) b->warp[w] = new std::barrier<>(32);
      b->smem_bytes = smem;
      b->smem = (unsigned char*)aligned_alloc(64, (smem + 64) / 64 * 64);
      memset(b->smem, 0xa5, smem);
      cls[r / {cluster}].blocks[r % {cluster}] = b;
      blocks.push_back(b);
    }}
    std::vector<std::thread> ts;
    for (unsigned r = 0; r < {per}; ++r)
      for (unsigned t = 0; t < 256; ++t)
        ts.emplace_back([=, &cls, &blocks] {{ threadIdx = {{t,0,0}}; blockIdx = {{k * {per} + r,0,0}}; g_blk = blocks[r]; g_cl = &cls[r / {cluster}]; fz_call(kernels[r], slots); }});
    for (auto& th : ts) th.join();
    for (fz_block_state* b : blocks) {{
      for (int w = 0; w < 8; ++w) delete b->warp[w];
      free(b->smem); delete b;
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
