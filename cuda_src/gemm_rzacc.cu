// cpemu: the exact FP8 GEMM kernel with the biased round-toward-zero accumulator (cpemu_tiled.cuh
// built with CPT_RZACC=1: each product one fma.rz into an accumulator whose ulp is the step's
// truncation grid, plus a count of the negative products that lose bits; see cpt_sum_rzacc).
// Ada and Hopper models (F <= 14); 64 x 64 outputs per block, 8 x 4 per thread.

#define CPT_RZACC 1
#ifndef CPT_BM  // tuning builds may set the geometry
#define CPT_BM 64
#define CPT_BN 64
#endif
#ifndef CPT_TM
#define CPT_TM 8  // outputs per thread along M
#endif
#ifndef CPT_TN
#define CPT_TN 4  // outputs per thread along N
#endif
#ifndef CPT_MINBLOCKS
#define CPT_MINBLOCKS 2
#endif
#ifndef CPT_SMEM_BYTES
#define CPT_SMEM_BYTES 38400  // 264 bytes per row of A and of B (the stage), 4608 of tables
#endif

#include "cpemu_tiled.cuh"

extern "C" __global__ void __launch_bounds__(CPT_THREADS, CPT_MINBLOCKS) cpemu_gemm_rzacc(CPT_KERNEL_PARAMS) {
    cpt_gemm_tiled_body(CPT_KERNEL_ARGS);
}
