// cpemu: cuda-rzacc (gemm_rzacc.cu's arithmetic and geometry) fed from stage images: each
// operand's codes are decoded once per call, per block of 64 rows and 32-element K chunk, by
// cpemu_rzacc_predecode into the bytes of the stage that the GEMM kernel would decode itself
// (cpt_store); the GEMM kernel copies one image per operand and step into one of two shared-memory
// stages (cp.async) while the other computes. Same bits as gemm_rzacc.cu; kernels.py runs it
// where every step lies in one K chunk and the images fit the memory it allows them.

#define CPT_RZACC 1
#define CPT_PREDECODE 1
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
#if defined(CPT_PIPE2) && CPT_PIPE2
#define CPT_MINBLOCKS 2  // three stages per block: two blocks fit an SM of 228 KB (Hopper)
#else
#define CPT_MINBLOCKS 3  // 168 registers; three blocks' stages fit an SM of 228 KB (Hopper)
#endif
#endif
#ifndef CPT_PASS1_MMA
#define CPT_PASS1_MMA 0
#endif
#ifndef CPT_SMEM_BYTES
#if defined(CPT_EPROD) && CPT_EPROD
#define CPT_SMEM_BYTES 55296  // two stages of 200 bytes per row of A and of B, and 32 e_max bytes per thread
#elif defined(CPT_STAGE_PASS1) && !CPT_STAGE_PASS1
#define CPT_SMEM_BYTES 51200  // two stages of 200 bytes per row of A and of B (no pass 1 operand)
#elif defined(CPT_PIPE2) && CPT_PIPE2
#define CPT_SMEM_BYTES 101376  // three stages of 264 bytes per row of A and of B (a measurement build)
#elif CPT_PASS1_MMA
#define CPT_SMEM_BYTES 71680  // two stages of 264 bytes per row of A and of B, and pass 1's 64 x 64 bytes
#else
#define CPT_SMEM_BYTES 67584  // two stages of 264 bytes per row of A and of B
#endif
#endif

#include "cpemu_tiled.cuh"

extern "C" __global__ void __launch_bounds__(CPT_THREADS, CPT_MINBLOCKS) cpemu_gemm_rzacc_pre(CPT_KERNEL_PARAMS) {
    cpt_gemm_tiled_body(CPT_KERNEL_ARGS);
}

// The stage images of one operand (rows x K codes of format fmt; see cpt_predecode_body): grid
// (ceil(K / 32), ceil(rows / 64)), CPT_THREADS threads, CPT_DECODE_SMEM_BYTES of shared memory.
extern "C" __global__ void __launch_bounds__(CPT_THREADS) cpemu_rzacc_predecode(const cpt_u8* __restrict__ X, int rows,
                                                                               int K, int fmt, int bf_emax,
                                                                               cpt_u8* __restrict__ img) {
    cpt_predecode_body(X, rows, K, fmt, bf_emax, img);
}

#if CPT_EPROD
// The e_max bytes of every step (measurement build; see cpt_eprod_body): grid (ceil(N / 64), ceil(M / 64)).
// not shipped: cpemu_rzacc_eprod
extern "C" __global__ void __launch_bounds__(CPT_THREADS) cpemu_rzacc_eprod(const cpt_u8* __restrict__ Pa,
                                                                           const cpt_u8* __restrict__ Pb, int nchunks,
                                                                           int K, int L, int nsteps,
                                                                           cpt_u8* __restrict__ Ep) {
    cpt_eprod_body(Pa, Pb, nchunks, K, L, nsteps, Ep);
}
#endif
