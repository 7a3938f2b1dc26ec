// Zero-padding of FP8 code matrices for the Ada-on-Hopper tensor-core path.
//
// The Ada sm_89 FP8 instruction adds 16 products per step (L = 16); Hopper's wgmma adds 32
// (L = 32). A Hopper step whose 32 K-elements hold 16 real products and 16 zero products
// computes the Ada step exactly (the zero products never raise e_max and add nothing; checked
// bit for bit on an H200, see README "Backends"). This kernel builds that layout: every
// 16-byte chunk of K of the (rows, K) row-major input becomes 32 bytes, the chunk followed by
// 16 zero bytes, so the output is (rows, 2K). Zeros (not copies) also keep 0 * NaN and
// 0 * Inf out of the padding products.

extern "C" __global__ void cpemu_pad_k16_to_k32(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                long long chunks) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  for (; i < chunks; i += stride) {
    dst[2 * i] = src[i];
    dst[2 * i + 1] = zero;
  }
}
