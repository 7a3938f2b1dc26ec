// cpemu: the tiled exact FP8 GEMM kernel for small M (the body and its design: cpemu_tiled.cuh).
//
// 16 x 32 outputs per block of 64 threads, 2 x 4 outputs per thread. A T-FDPA chain runs
// along K in one thread, so the only parallelism is the outputs: with M = 16 the 64 x 64
// geometry of gemm_tiled.cu leaves three quarters of each block's rows empty and gives
// each SM one or two busy warps; this geometry has no empty rows and four times as many
// threads per output tile. Same bits (every output runs the same steps in the same order).

#define CPT_BM 16
#define CPT_BN 32
#ifndef CPT_TM
#define CPT_TM 2  // outputs per thread along M
#endif
#ifndef CPT_TN
#define CPT_TN 4  // outputs per thread along N
#endif
#ifndef CPT_MINBLOCKS
#define CPT_MINBLOCKS 8
#endif
#define CPT_SMEM_BYTES 19840

#include "cpemu_tiled.cuh"

extern "C" __global__ void __launch_bounds__(CPT_THREADS, CPT_MINBLOCKS)
    cpemu_gemm_tiled_small_m(CPT_KERNEL_PARAMS) {
    cpt_gemm_tiled_body(CPT_KERNEL_ARGS);
}
