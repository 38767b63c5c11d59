"""NVRTC's time to compile CUDA C files to CUBIN, as the runtime compiles a kernel's entry point
(`--gpu-architecture=sm_ARCH --std=c++17`), after one untimed compile of a small kernel that loads
the library: per file, its first compile (what a kernel's first use pays) and the median of REPS
more. Used for the golden kernels' before-and-after table in
benches/NOTES.md (issue 19); runs wherever libnvrtc is on the loader's path (the GPU machine, or
here with the PyPI wheel). Usage: nvrtc_times.py [--arch 90] [--reps 5] FILE.cu..."""
import ctypes, statistics, sys, time

args = sys.argv[1:]
arch, reps = 90, 5
while args and args[0].startswith("--"):
    flag, value = args[0], args[1]
    args = args[2:]
    arch = int(value) if flag == "--arch" else arch
    reps = int(value) if flag == "--reps" else reps
for name in ("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"):
    try:
        nvrtc = ctypes.CDLL(name)
        break
    except OSError:
        nvrtc = None
if nvrtc is None:
    sys.exit("libnvrtc not found")
options = [f"--gpu-architecture=sm_{arch}".encode(), b"--std=c++17"]
opts = (ctypes.c_char_p * len(options))(*options)

def compile_once(source, name):
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, name, 0, None, None) == 0
    started = time.perf_counter()
    result = nvrtc.nvrtcCompileProgram(prog, len(options), opts)
    elapsed = (time.perf_counter() - started) * 1e3
    if result != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        sys.exit(f"{name.decode()}: {log.value.decode()[:2000]}")
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return elapsed

compile_once(b'extern "C" __global__ void fz_warm(float* x) { x[threadIdx.x] = 1.0f; }\n', b"warm.cu")
print("file\tbytes\tfirst ms\tmedian ms")
for path in args:
    source = open(path, "rb").read()
    name = path.rsplit("/", 1)[-1].encode()
    first = compile_once(source, name)
    times = [compile_once(source, name) for _ in range(reps)]
    print(f"{path}\t{len(source)}\t{first:.1f}\t{statistics.median(times):.1f}")
