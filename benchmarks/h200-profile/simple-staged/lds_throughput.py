"""Shared-memory load throughput by address pattern: warp-wide LDS instructions per SM clock.

    python lds_throughput.py out.json      (needs cupy and a CUDA GPU; two 1024-thread blocks per SM)

Patterns over a warp's 32 lanes, rows 144 bytes apart (no bank conflicts): "uniform" (one
address), "4rows" (lane / 8: one address per 8 lanes, the staged kernel's A operand),
"8cols" (lane % 8: 8 addresses, its B operand) and "32distinct". Only the 128-bit figures are
of single instructions: the 64- and 32-bit loops read consecutive words, which the compiler
may merge into wider loads.
"""
import cupy as cp, json, sys
src = r'''
extern "C" __global__ void __launch_bounds__(1024, 2) lds(unsigned* out, long long* cyc, int iters, int mode, int width) {
  __shared__ __align__(16) unsigned sh[8192];
  for (int i = threadIdx.x; i < 8192; i += blockDim.x) sh[i] = i * 2654435761u;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  int row = mode == 0 ? 0 : mode == 1 ? (lane >> 3) : mode == 2 ? (lane & 7) : lane;
  int base = row * 36;
  unsigned acc = 0;
  long long t0 = clock64();
  if (width == 4) {
    for (int it = 0; it < iters; ++it) {
#pragma unroll
      for (int j = 0; j < 8; ++j) { uint4 v = *(const uint4*)&sh[base + j * 4]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
      base ^= 32 * 36 * 4 + (acc & 1) * 0;  asm volatile("" : "+r"(base));
    }
  } else if (width == 2) {
    for (int it = 0; it < iters; ++it) {
#pragma unroll
      for (int j = 0; j < 8; ++j) { uint2 v = *(const uint2*)&sh[base + j * 2]; acc ^= v.x ^ v.y; }
      base ^= 32 * 36 * 4 + (acc & 1) * 0;  asm volatile("" : "+r"(base));
    }
  } else {
    for (int it = 0; it < iters; ++it) {
#pragma unroll
      for (int j = 0; j < 8; ++j) { unsigned v = sh[base + j]; acc ^= v; }
      base ^= 32 * 36 * 4 + (acc & 1) * 0;  asm volatile("" : "+r"(base));
    }
  }
  __syncthreads();
  long long t1 = clock64();
  if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
'''
k = cp.RawKernel(src, "lds")
sms = cp.cuda.Device().attributes["MultiProcessorCount"]
blocks = sms * 2
out = cp.zeros(blocks * 1024, cp.uint32); cyc = cp.zeros(blocks, cp.int64)
iters = 4000
res = {}
for width in (4, 2, 1):
    for mode, name in enumerate(("uniform", "4rows", "8cols", "32distinct")):
        k((blocks,), (1024,), (out, cyc, cp.int32(iters), cp.int32(mode), cp.int32(width)))
        k((blocks,), (1024,), (out, cyc, cp.int32(iters), cp.int32(mode), cp.int32(width)))
        cp.cuda.Device().synchronize()
        c = int(cyc.max())
        lds = 2 * 32 * iters * 8
        res[f"LDS{32*width}_{name}"] = round(lds / c, 3)
        print(f"LDS.{32*width} {name:11s}: {lds / c:.3f} warp-LDS per SM clock", flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
