/* A stand-in for the CUDA driver (libcuda.so) that does no GPU work, to time fuse's host code on a
 * machine without a GPU: `bash benches/stub/run` builds it and runs the `host` bench against it.
 *
 * It reports one device, "fuse stub driver" (sm_90, 132 SMs). Memory is host memory from malloc,
 * so uploads and reads work; modules and functions are dummy handles; cuLaunchKernel only checks
 * its arguments and counts the launch. Every call costs a few nanoseconds, so a loop of launches
 * against it times fuse, cudarc and the call itself, and nothing of a real driver or GPU.
 * Only the entry points fuse reaches are here; cudarc names a missing one when it is needed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;
typedef unsigned long long CUdeviceptr;

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_CONTEXT = 201, INVALID_DEVICE = 101 };

static int context_object, module_object, function_object, event_object;
static __thread CUcontext current;
/* Launches so far, for a test that wants to see them. */
unsigned long long fuse_stub_launches;

CUresult cuInit(unsigned flags) { (void)flags; return OK; }
CUresult cuDriverGetVersion(int *version) { *version = 12080; return OK; }
CUresult cuDeviceGetCount(int *count) { *count = 1; return OK; }
CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  if (ordinal != 0) return INVALID_DEVICE;
  *device = 0;
  return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
  (void)device;
  strncpy(name, "fuse stub driver", (size_t)len);
  if (len > 0) name[len - 1] = 0;
  return OK;
}
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
  (void)device;
  switch (attribute) {
  case 16: *value = 132; break; /* multiprocessor count */
  case 75: *value = 9; break;   /* compute capability major */
  case 76: *value = 0; break;   /* minor */
  default: *value = 0; break;   /* memory pools and everything else: not supported */
  }
  return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
  (void)device;
  *ctx = &context_object;
  return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) { (void)device; return OK; }
CUresult cuCtxGetCurrent(CUcontext *ctx) { *ctx = current; return OK; }
CUresult cuCtxSetCurrent(CUcontext ctx) { current = ctx; return OK; }
CUresult cuCtxSynchronize(void) { return OK; }
CUresult cuStreamSynchronize(CUstream stream) { (void)stream; return OK; }
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned flags) {
  (void)stream; (void)event; (void)flags;
  return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) return OUT_OF_MEMORY;
  *ptr = (CUdeviceptr)(uintptr_t)p;
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr ptr) { free((void *)(uintptr_t)ptr); return OK; }
CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t bytes, CUstream stream) {
  (void)stream;
  return cuMemAlloc_v2(ptr, bytes);
}
CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) { (void)stream; return cuMemFree_v2(ptr); }
CUresult cuMemsetD8Async(CUdeviceptr ptr, unsigned char value, size_t n, CUstream stream) {
  (void)stream;
  memset((void *)(uintptr_t)ptr, value, n);
  return OK;
}
CUresult cuMemsetD8_v2(CUdeviceptr ptr, unsigned char value, size_t n) {
  return cuMemsetD8Async(ptr, value, n, 0);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream stream) {
  (void)stream;
  memcpy((void *)(uintptr_t)dst, src, n);
  return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream stream) {
  (void)stream;
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  (void)stream;
  memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  return OK;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  if (!image) return INVALID_VALUE;
  *module = &module_object;
  return OK;
}
CUresult cuModuleUnload(CUmodule module) { (void)module; return OK; }
CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
  (void)module; (void)name;
  *function = &function_object;
  return OK;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params,
                        void **extra) {
  (void)stream; (void)shared; (void)extra;
  if (!current) return INVALID_CONTEXT;
  if (f != &function_object || !gx || !gy || !gz || !bx || !by || !bz || !params) return INVALID_VALUE;
  fuse_stub_launches++;
  return OK;
}

CUresult cuEventCreate(CUevent *event, unsigned flags) { (void)flags; *event = &event_object; return OK; }
CUresult cuEventDestroy_v2(CUevent event) { (void)event; return OK; }
CUresult cuEventRecord(CUevent event, CUstream stream) { (void)event; (void)stream; return OK; }
CUresult cuEventSynchronize(CUevent event) { (void)event; return OK; }
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
  (void)start; (void)end;
  *ms = 0.0f;
  return OK;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
  (void)error;
  *name = "CUDA_ERROR_STUB";
  return OK;
}
CUresult cuGetErrorString(CUresult error, const char **text) {
  (void)error;
  *text = "an error from the fuse stub driver";
  return OK;
}
