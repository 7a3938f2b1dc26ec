// cpemu: the body of the tiled exact FP8 GEMM kernels (gemm_tiled.cu, gemm_tiled_small_m.cu).
//
// Same numbers as cuda_src/gemm_simple.cu and cpemu/reference.py (tfdpa, chain, accumulate,
// epilogue), computed faster: a block owns a CPT_BM x CPT_BN tile of outputs, each thread
// CPT_TM x CPT_TN of them; for every T-FDPA step (L products along K) the block decodes the
// step's FP8 codes of A and B once into shared memory (magnitude, sign mask, pass 1's operand,
// per-row sign bits and NaN/Inf flags), and each thread runs the step for its outputs from
// there, while the next step's codes load.
//
// One step for one output (reference.tfdpa), in two passes over the L products:
//
// 1. e_max = max(e_a + e_b over the nonzero products, exponent of c). e4m3 x e4m3 on the
//    fast path: from a bf16 sum of powers of two, two products per fma.rn.bf16x2 on the FP
//    pipe (cpt_emax_bf16). Otherwise from the exponents, where zero, NaN and Inf codes carry
//    CPT_SENT, far below anything that can decide e_max (the same trick as
//    reference.ZERO_EXP); on sm_90 they are packed two per 32-bit word and one DPX
//    instruction (__viaddmax_s16x2: max(a + b, c) per 16-bit lane) updates two outputs.
//
// 2. The truncated sum. Fast path (F <= 16, i.e. Ada and Hopper: F = 13): each product's
//    magnitude is truncated toward zero to the grid 2**g, g = e_max - F, by one IEEE
//    round-toward-zero fused multiply-add against the constant C = 2**(g + 23):
//        T = RZ(|a| * |b| + C) = C + t * 2**g,   t = floor(|a*b| / 2**g)
//    exact because |a*b| has at most 8 significant bits and |a*b| < 2**(e_max + 2) <=
//    2**(g + 23), so |a*b| + C lies in [2**(g+23), 2**(g+24)), whose ulp is 2**g. The FP32
//    encoding of T is then the integer bits(C) + t, and the product's sign m (0 or all ones,
//    the XOR of the operands' sign masks) is applied in two's complement: y = bits(T) ^ m is
//    bits(C) + t when m = 0 and -(bits(C) + t) - 1 when m = -1. Summed in wrapping 32-bit
//    integer arithmetic over the step's n products, n_neg of them negative (a popcount of
//    the XOR of the two operands' per-step sign bit masks):
//        sum(sign * t) = sum(y) - bits(C) * (n - 2 * n_neg) + n_neg
//    c is truncated likewise, in FP32: RZ(c + Cs) - Cs with Cs = +-C of c's sign (exact,
//    |c| < 2**(e_max + 1)). The products' sum (|sum| < 2**21 units of 2**g) converts exactly
//    to FP32, and sum * 2**g + trunc(c) is one exact RN fused multiply-add; rounding the
//    result toward zero to R fraction bits with the floor at 2**-126 is then clearing the
//    low 23 - R bits of its encoding (which also handles subnormals exactly). This is the
//    same integer `(P << S0) >> (e_max - E)` of the reference: one FFMA, one LOP3 and half
//    an IADD3 per product; only IEEE-defined operations with explicit rounding modes (PTX
//    fma.rz, add.rz, fma.rn without .ftz) and integer operations are used, so the bits do
//    not depend on the GPU or on compiler flags.
//    Integer path (F > 16, Blackwell's F = 25): the reference's int64 arithmetic verbatim.
//
// NaN/Inf: each step records per row of A and per column of B whether its L codes hold a
// NaN or an Inf; outputs touched by one (or whose accumulator is not finite) are
// finished by cpt_specials (reference._specials), which rereads the codes.
//
// The schedule (slices, promotion chains, FP32 RN folds) and the epilogue are those of
// gemm_simple.cu, per output, in the same order. Split-K slices run inside each thread in
// slice order.
//
// Build: NVRTC, no system header (cpemu_fp32.cuh only); the bits do not depend on -ftz or
// --fmad (see cpemu_fp32.cuh).
// Launch: grid (ceil(N / CPT_BN), ceil(M / CPT_BM)), CPT_THREADS threads, CPT_SMEM_BYTES of
// dynamic shared memory; requires K, the slice bounds and L to be multiples of 8
// (kernels.py checks).
//
// The including .cu file sets the geometry -- CPT_BM x CPT_BN outputs per block, CPT_TM x
// CPT_TN per thread, CPT_MINBLOCKS, CPT_SMEM_BYTES -- and defines the extern "C" kernel,
// which calls cpt_gemm_tiled_body. The bits do not depend on the geometry: every output
// runs the same steps in the same order whichever thread owns it.

#include "cpemu_fp32.cuh"
#include "cpemu_fp8.cuh"
#include "cpemu_schedule.cuh"

typedef unsigned char cpt_u8;
typedef unsigned short cpt_u16;
typedef unsigned int cpt_u32;
typedef long long cpt_i64;
typedef unsigned long long cpt_u64;

#if !defined(CPT_BM) || !defined(CPT_BN) || !defined(CPT_TM) || !defined(CPT_TN) || !defined(CPT_MINBLOCKS) || \
    !defined(CPT_SMEM_BYTES)
#error "the including file sets CPT_BM, CPT_BN, CPT_TM, CPT_TN, CPT_MINBLOCKS and CPT_SMEM_BYTES"
#endif
#ifndef CPT_PROBE_MMA
#define CPT_PROBE_MMA 0  // measurement builds only: bf16 mma.sync instructions issued per step, results unused
#endif
#ifndef CPT_RZACC
#define CPT_RZACC 0  // 1: pass 2 by the biased round-toward-zero accumulator (cpt_sum_rzacc; F <= 14)
#endif
#ifndef CPT_PROBE_SKIP
#define CPT_PROBE_SKIP 0  // measurement builds only (wrong bits): 1 no pass 1, 2 no count of cpt_sum_rzacc,
                          // 4 the count without its sign mask (a signed dp4a of the bytes)
#endif
#ifndef CPT_SUM_UNROLL
#define CPT_SUM_UNROLL 1  // unrolling of pass 2's loop (fast path), in pairs of K elements
#endif
#ifndef CPT_EMAX_UNROLL
#define CPT_EMAX_UNROLL 2  // unrolling of pass 1's bf16 loop, in pairs of K elements
#endif
#ifndef CPT_FIXED_L
#define CPT_FIXED_L 0  // > 0 (measurement builds): steps of this klen run passes compiled for it (loops unrolled)
#endif
#ifndef CPT_PREDECODE
#define CPT_PREDECODE 0  // 1: stages copied (cp.async, two buffers) from images decoded once per call (cuda-rzacc)
#endif
#ifndef CPT_PASS1_MMA
#define CPT_PASS1_MMA 0  // 1 (with CPT_PREDECODE; measurement builds): pass 1 of e4m3 x e4m3 on tensor cores (cpt_emax_mma)
#endif
#ifndef CPT_STAGE_PASS1
#define CPT_STAGE_PASS1 1  // 0 (measurement builds, with CPT_PROBE_SKIP=1): the stage without pass 1's operand
#endif
#ifndef CPT_EPROD
#define CPT_EPROD 0  // 1 (measurement builds, with CPT_STAGE_PASS1=0): pass 1's e_max read from cpemu_rzacc_eprod's bytes
#endif
static_assert(CPT_STAGE_PASS1 || (CPT_RZACC && ((CPT_PROBE_SKIP & 1) || CPT_EPROD)),
              "CPT_STAGE_PASS1=0: cuda-rzacc without pass 1 in the GEMM kernel");
static_assert(!CPT_EPROD || (!CPT_STAGE_PASS1 && CPT_PREDECODE && !(CPT_PROBE_SKIP & 1)),
              "CPT_EPROD: with CPT_STAGE_PASS1=0 and CPT_PREDECODE (gemm_rzacc_pre)");
#ifndef CPT_PIPE2
#define CPT_PIPE2 0  // 1 (measurement builds, with CPT_PREDECODE): a two-step software pipeline (cpt_step_pipe2)
#endif
static_assert(!CPT_PIPE2 || (CPT_PREDECODE && CPT_STAGE_PASS1 && !CPT_PASS1_MMA && !CPT_EPROD && !CPT_PROBE_SKIP &&
                             !CPT_PROBE_MMA && !CPT_FIXED_L),
              "CPT_PIPE2: gemm_rzacc_pre's exact build, pass 1 in the GEMM kernel on CUDA cores (no probe, no CPT_FIXED_L)");
#ifndef CPT_LEAN
#define CPT_LEAN 0  // 1 (measurement builds of cuda-rzacc): e_max carried as the FP32 bits of 2**e_max (cpt_emax_bits)
#endif
static_assert(!CPT_LEAN || (CPT_RZACC && !CPT_PIPE2 && !CPT_EPROD && !CPT_PASS1_MMA && !CPT_PROBE_SKIP),
              "CPT_LEAN: cuda-rzacc's exact build, pass 1 on CUDA cores");
#ifndef CPT_KPARTS
#define CPT_KPARTS 1  // threads per output (cuda-rzacc): a step's products split over them (small M)
#endif
#if CPT_KPARTS > 1
// CPT_KPARTS adjacent lanes share their outputs; lane part p takes the products of the step's
// 4-code words p, p + CPT_KPARTS, ... (pass 1 likewise its 2-code words, or codes), and the parts
// meet by warp shuffles: e_max by max, the step's sum as exact FP32 adds of X_t - B
// (cpemu.rzacc_twin.step(parts=...) asserts why they are exact). Part 0 folds and writes.
static_assert(CPT_RZACC && (CPT_KPARTS == 2 || CPT_KPARTS == 4), "CPT_KPARTS: 2 or 4, cuda-rzacc only");
static_assert(!CPT_LEAN, "CPT_LEAN: one thread per output");
#define CPT_PART ((int)(threadIdx.x % CPT_KPARTS))
#endif
// A step's loop over its K groups of `step` elements: this part's groups (CPT_KPARTS > 1), or
// all of them with the unrolling `unroll` (a CPT_UNROLL).
#if CPT_KPARTS > 1
#define CPT_STEP_LOOP(var, end, step, unroll) for (int var = CPT_PART * (step); var < (end); var += CPT_KPARTS * (step))
#else
#define CPT_STEP_LOOP(var, end, step, unroll) unroll for (int var = 0; var < (end); var += (step))
#endif
#define CPT_PRAGMA_(x) _Pragma(#x)
#define CPT_UNROLL(n) CPT_PRAGMA_(unroll n)
#define CPT_KT 32  // K elements per shared-memory stage: the largest L
#define CPT_THREADS ((CPT_BM / CPT_TM) * (CPT_BN / CPT_TN) * CPT_KPARTS)
#define CPT_CHUNKS(rows) ((rows) * CPT_KT / 8)  // 8-byte chunks of codes per operand stage
// chunks per thread (a thread past the last chunk loads none: CPT_HAS_CHUNK)
#define CPT_LOADS(rows) ((CPT_CHUNKS(rows) + CPT_THREADS - 1) / CPT_THREADS)
#define CPT_HAS_CHUNK(rows, c) (CPT_CHUNKS(rows) % CPT_THREADS == 0 || (c) < CPT_CHUNKS(rows))
#define CPT_SENT (-256)                          // exponent of zero / NaN / Inf codes

static_assert(CPT_TM % 2 == 0 && CPT_TN % 2 == 0, "outputs per thread: even (vector loads, DPX pairs)");
static_assert(CPT_TM * CPT_TN <= 32, "the NaN/Inf classes of a thread's outputs fit 64 bits");
static_assert((CPT_CHUNKS(CPT_BM) % CPT_THREADS == 0 || CPT_THREADS % CPT_CHUNKS(CPT_BM) == 0) &&
                  (CPT_CHUNKS(CPT_BN) % CPT_THREADS == 0 || CPT_THREADS % CPT_CHUNKS(CPT_BN) == 0),
              "the 8-byte chunks of a stage split evenly over the threads (or the threads over them)");


// One K stage of one operand (R rows: CPT_BM of A, CPT_BN of B), transposed ([k][row]) so
// that a thread's rows are contiguous.
template <int R>
struct CptTile {
#if CPT_RZACC
    float v[CPT_KT][R];           // the signed value (0 for NaN / Inf codes)
    cpt_u32 lam[CPT_KT / 4][R];   // bytes k = 4q..4q+3: 63 - (lambda - lambda_min), 0 for zero / NaN / Inf
    cpt_u32 sg[CPT_KT / 4][R];    // the same codes' sign bits (the word & 0x80808080)
#else
    float v[CPT_KT][R];    // fast path: the magnitude |value|; integer path: the significand bits
    cpt_u32 s[CPT_KT][R];  // sign mask: 0, or 0xFFFFFFFF for a code with the sign bit set
#endif
#if CPT_STAGE_PASS1
    union {                         // pass 1's operand, by the kernel's `bf_emax`:
        short e[CPT_KT][R];         // exponent, CPT_SENT for m == 0 (cpt_emax, cpt_sum_int)
        cpt_u32 x2[CPT_KT / 2][R];  // bf16 pairs (codes 2q, 2q + 1) of 2**(6 e), 0 for m == 0
    };                              // (cpt_emax_bf16)
#endif
    cpt_u32 flag[R];  // byte q: a NaN or Inf among the codes of chunk q of the row
    cpt_u32 neg[R];   // bit k: code k of the step has the sign bit set
};

// One stage: the decoded codes of one step of both operands.
struct CptStage {
    CptTile<CPT_BM> a;
    CptTile<CPT_BN> b;
};

// The block's shared memory (dynamic: CPT_SMEM_BYTES): the stage and the decode tables.
struct CptShared {
    CptStage st;
    // per operand (0: A, 1: B) and code: .x the value / significand bits; .y the bf16 bits of
    // 2**(8 (e - 1)) (e4m3, for cpt_emax_bf16; 0 when m == 0) | the exponent (CPT_SENT when
    // m == 0) << 16
    uint2 lut[2][256];
#if CPT_RZACC
    cpt_u8 lamlut[2][256];  // per operand and code: its byte of CptTile::lam
#endif
};

#if CPT_PREDECODE
// The stage images (CPT_PREDECODE): for each block of R rows and each 32-element K chunk of an
// operand, the first CPT_IMAGE_BYTES(R) bytes of its CptTile as cpt_store decodes that chunk
// (every field up to flag; neg is not read by cuda-rzacc). cpemu_rzacc_predecode writes them
// once per call; the GEMM kernel copies one per operand and step, in two alternating stages.
#define CPT_IMAGE_BYTES(R) (sizeof(CptTile<R>) - 4 * (R))
static_assert(CPT_RZACC && CPT_KPARTS == 1 && CPT_BM == CPT_BN, "CPT_PREDECODE: cuda-rzacc, square blocks");
static_assert(CPT_IMAGE_BYTES(CPT_BM) % 16 == 0, "stage images are copied in 16-byte pieces");
struct CptSharedPre {
    CptStage st[CPT_PIPE2 ? 3 : 2];  // CPT_PIPE2: this step's, the next step's and the one after's
#if CPT_EPROD
    cpt_u32 ep[CPT_THREADS][8];  // each thread's e_max bytes of the step (row i: word i, column j: byte j)
#endif
#if CPT_PASS1_MMA
    signed char emx[CPT_BM][CPT_BN];  // pass 1's e_max of the products, from the MMA layout to the threads'
#endif
};
// kernels.py launches the GEMM with CPT_SMEM_BYTES and the predecode kernel with CPT_DECODE_SMEM_BYTES
static_assert(sizeof(CptSharedPre) == CPT_SMEM_BYTES, "shared memory layout: update CPT_SMEM_BYTES and kernels.py");
#define CPT_DECODE_SMEM_BYTES (CPT_STAGE_PASS1 ? 38400 : 30208)  // sizeof(CptShared): one stage and the decode tables
static_assert(sizeof(CptShared) == CPT_DECODE_SMEM_BYTES, "shared memory layout: update kernels.py");
#else
// kernels.py launches with CPT_SMEM_BYTES of dynamic shared memory (TILED_VARIANTS)
static_assert(sizeof(CptShared) == CPT_SMEM_BYTES, "shared memory layout: update CPT_SMEM_BYTES and kernels.py");
#endif

// ------------------------------------------------------------------------ IEEE FP32
// Every FP32 operation of this file is one of cpemu_fp32.cuh's PTX instructions without
// .ftz. __int2float_rn only converts integers below 2**24 (exact).
// ------------------------------------------------------------------------ formats


// The smallest lambda (exponent of the lowest set bit of a code's value) of a format: its
// smallest subnormal, 2**(1 - bias - fb).
__device__ __forceinline__ int cpt_lambda_min(int is_e5m2) { return is_e5m2 ? -16 : -9; }

// Decode tables of both operands into shared memory. Fast path: the exact FP32 magnitude
// m * 2**(e - fb) (the sign travels as a mask); integer path: m << S0 for A, m for B
// (P = (m_a << S0) * m_b).
__device__ __forceinline__ void cpt_build_luts(CptShared& sh, int a_fmt, int b_fmt, int fast, int S0) {
    for (int i = threadIdx.x; i < 512; i += CPT_THREADS) {
        const int op = i >> 8, code = i & 255;
        const int fmt = op ? b_fmt : a_fmt;
        int sign, m, e, nan, inf;
        cpemu_fp8_decode((cpt_u32)code, fmt, &sign, &m, &e, &nan, &inf);
        cpt_u32 v;
        if (fast) {
            // m * 2**(e - fb): m < 16 converts exactly, the power of two (>= 2**-16) is normal
            const float p2 = __uint_as_float((cpt_u32)(127 + e - cpemu_fp8_frac_bits(fmt)) << 23);
            v = __float_as_uint(cpemu_fmul_rn(__int2float_rn(m), p2));
#if CPT_RZACC
            if (sign < 0) v |= 0x80000000u;  // the signed value
            // lambda = e - fb + tz(m): the exponent of the value's lowest set bit
            const int lam = m == 0 ? 0 : e - cpemu_fp8_frac_bits(fmt) + __ffs(m) - 1;
            sh.lamlut[op][code] = (cpt_u8)(m == 0 ? 0 : 63 - (lam - cpt_lambda_min(fmt)));
#endif
        } else {
            v = op ? (cpt_u32)m : ((cpt_u32)m << S0);
        }
        // e in [-6, 8]; CPT_LEAN doubles A's term, so that the sum's exponent field / 8 is E_max + 14
        const cpt_u32 x = m == 0 || fmt ? 0u : (cpt_u32)(8 * (e - 1) + 127 + (CPT_LEAN && op == 0)) << 7;
        sh.lut[op][code] = make_uint2(v, x | ((cpt_u32)(m == 0 ? CPT_SENT : e) << 16));
    }
}

// ------------------------------------------------------------------------ tiles

// Codes of rows [r0, r0 + R) and K elements [k, ke) of X (rows x K, row-major) into
// registers, 8-byte chunks; zeros outside (zero codes: zero products change nothing).
template <int R>
__device__ __forceinline__ void cpt_fetch(const cpt_u8* __restrict__ X, int rows, int K, int r0, int k, int ke,
                                          uint2 (&raw)[CPT_LOADS(R)]) {
#pragma unroll
    for (int q = 0; q < CPT_LOADS(R); ++q) {
        const int c = (int)threadIdx.x + q * CPT_THREADS;
        const int row = c % R, kc = c / R;
        const int kk = k + kc * 8, gr = r0 + row;
        uint2 v = make_uint2(0u, 0u);
        if (CPT_HAS_CHUNK(R, c) && gr < rows && kk < ke) v = __ldg((const uint2*)(X + (cpt_i64)gr * K + kk));
        raw[q] = v;
    }
}

// 0xFFFFFFFF if byte b of w has its sign bit set, else 0 (PTX prmt with the sign-replicate
// selector bit).
__device__ __forceinline__ cpt_u32 cpt_sign_bytes(cpt_u32 w, int b) {
    cpt_u32 r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"(0x8888u + 0x1111u * (cpt_u32)b));
    return r;
}

// Nonzero if some byte of w is a NaN or Inf code: e4m3 (fn) S.1111.111, e5m2 S.11111.xx.
__device__ __forceinline__ cpt_u32 cpt_special_bytes(cpt_u32 w, int is_e5m2) {
    return is_e5m2 ? ((w & 0x7C7C7C7Cu) + 0x04040404u) & 0x80808080u
                   : ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
}

// The sign bits of the 4 codes of w (bits 7, 15, 23, 31) as a 4-bit number, by one multiply
// that moves them to bits 21..24 without collisions.
__device__ __forceinline__ cpt_u32 cpt_sign_nibble(cpt_u32 w) {
    return ((((w & 0x80808080u) >> 7) * 0x204081u) >> 21) & 0xFu;
}

// Decode this thread's chunks (cpt_fetch) into the stage tile t: magnitudes and sign masks
// for pass 2, pass 1's operand (bf16 pairs when bf_emax, else exponents), and per row and
// chunk the sign bits and a NaN/Inf flag (bytes of t.neg and t.flag). The step has klen K
// elements; the passes read no code past them, so a chunk past them (half the stage in a
// step of Ada's L = 16) only clears its two bytes, which are read as whole words.
// CPT_SKIP_PAST_END=0 builds the decode of every chunk, for comparison (benchmarks/README.md).
#ifndef CPT_SKIP_PAST_END
#define CPT_SKIP_PAST_END 1
#endif
template <int R>
__device__ __forceinline__ void cpt_store(CptTile<R>& t, const uint2 (&raw)[CPT_LOADS(R)],
                                          const uint2* lut, const cpt_u8* lamlut, int is_e5m2, int bf_emax,
                                          int klen) {
#pragma unroll
    for (int q = 0; q < CPT_LOADS(R); ++q) {
        const int c = (int)threadIdx.x + q * CPT_THREADS;
        if (!CPT_HAS_CHUNK(R, c)) break;
        const int row = c % R, kc = c / R;
        if (CPT_SKIP_PAST_END && kc * 8 >= klen) {
            ((cpt_u8*)t.neg)[row * 4 + kc] = 0;
            ((cpt_u8*)t.flag)[row * 4 + kc] = 0;
            continue;
        }
        cpt_u32 xe[8];
#pragma unroll
        for (int b = 0; b < 8; ++b) {
            const cpt_u32 w = b < 4 ? raw[q].x : raw[q].y;
            const uint2 d = lut[__byte_perm(w, 0u, 0x4440u + (b & 3))];
            const int kk = kc * 8 + b;
            t.v[kk][row] = __uint_as_float(d.x);
#if !CPT_RZACC
            t.s[kk][row] = cpt_sign_bytes(w, b & 3);
#endif
            xe[b] = d.y;
        }
#if CPT_RZACC
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const cpt_u32 w = h ? raw[q].y : raw[q].x;
            const cpt_u32 l01 = __byte_perm(lamlut[w & 0xFFu], lamlut[(w >> 8) & 0xFFu], 0x0040u);
            const cpt_u32 l23 = __byte_perm(lamlut[(w >> 16) & 0xFFu], lamlut[w >> 24], 0x0040u);
            t.lam[kc * 2 + h][row] = __byte_perm(l01, l23, 0x5410u);
            t.sg[kc * 2 + h][row] = w & 0x80808080u;
        }
#endif
#if CPT_STAGE_PASS1
        if (bf_emax) {
#pragma unroll
            for (int h = 0; h < 4; ++h) t.x2[kc * 4 + h][row] = __byte_perm(xe[2 * h], xe[2 * h + 1], 0x5410u);
        } else {
#pragma unroll
            for (int b = 0; b < 8; ++b) t.e[kc * 8 + b][row] = (short)(xe[b] >> 16);
        }
#endif
        ((cpt_u8*)t.neg)[row * 4 + kc] = (cpt_u8)(cpt_sign_nibble(raw[q].x) | (cpt_sign_nibble(raw[q].y) << 4));
        ((cpt_u8*)t.flag)[row * 4 + kc] =
            (cpt_u8)((cpt_special_bytes(raw[q].x, is_e5m2) | cpt_special_bytes(raw[q].y, is_e5m2)) != 0);
    }
}

#include "cpemu_tiled_pass1.cuh"
#include "cpemu_tiled_pass2.cuh"

#if CPT_PREDECODE
// ------------------------------------------------------------------------ stage images

// One 16-byte asynchronous copy from global to shared memory (PTX cp.async.cg, sm_80 and newer).
__device__ __forceinline__ void cpt_cp_async16(void* dst, const void* src) {
    cpt_u32 s;
    asm volatile("{ .reg .u64 p; cvta.to.shared.u64 p, %1; cvt.u32.u64 %0, p; }" : "=r"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cpt_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cpt_cp_async_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Starts the copy of the image of row block rb and the K chunk holding element k into tile t.
template <int R>
__device__ __forceinline__ void cpt_copy_image(CptTile<R>& t, const cpt_u8* __restrict__ img, int rb, int nchunks,
                                               int k) {
    const cpt_u8* src = img + ((cpt_i64)rb * nchunks + (k >> 5)) * CPT_IMAGE_BYTES(R);
    constexpr int units = CPT_IMAGE_BYTES(R) / 16;
#pragma unroll
    for (int u = 0; u < (units + CPT_THREADS - 1) / CPT_THREADS; ++u) {
        const int i = (int)threadIdx.x + u * CPT_THREADS;
        if (units % CPT_THREADS == 0 || i < units) cpt_cp_async16((cpt_u8*)&t + 16 * i, src + 16 * i);
    }
}

#if CPT_EPROD
// Starts the copy of this thread's 32 e_max bytes of step `step` (cpemu_rzacc_eprod's layout: per
// block of outputs, per step, per thread of the GEMM's block) into sp.ep[threadIdx.x].
template <typename S>
__device__ __forceinline__ void cpt_copy_eprod(S& sp, const cpt_u8* __restrict__ Ep, int nsteps, int step) {
    const cpt_u8* src = Ep + ((((cpt_i64)blockIdx.y * gridDim.x + blockIdx.x) * nsteps + step) * CPT_THREADS +
                              threadIdx.x) * 32;
    cpt_cp_async16(&sp.ep[threadIdx.x][0], src);
    cpt_cp_async16(&sp.ep[threadIdx.x][4], src + 16);
}
#endif

// The predecode kernel's body: the image of rows [R * blockIdx.y, + R) and K chunk blockIdx.x of
// X (rows x K codes of format fmt) into img, by the decode of the GEMM kernels (cpt_store), with
// zeros in every byte that decode leaves unwritten. bf_emax: pass 1's operand (both operands e4m3).
__device__ __forceinline__ void cpt_predecode_body(const cpt_u8* __restrict__ X, int rows, int K, int fmt,
                                                   int bf_emax, cpt_u8* __restrict__ img) {
    extern __shared__ __align__(16) unsigned char cpt_smem[];
    CptShared& sh = *reinterpret_cast<CptShared*>(cpt_smem);
    CptTile<CPT_BM>& t = sh.st.a;
    cpt_build_luts(sh, fmt, fmt, 1, 0);
    const int k = (int)blockIdx.x * CPT_KT, ke = min(k + CPT_KT, K);
    uint2 raw[CPT_LOADS(CPT_BM)];
    cpt_fetch<CPT_BM>(X, rows, K, (int)blockIdx.y * CPT_BM, k, ke, raw);
    for (int i = threadIdx.x; i < (int)(sizeof(CptTile<CPT_BM>) / 16); i += CPT_THREADS)
        ((uint4*)&t)[i] = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();  // the tables are built, the tile is cleared
    cpt_store(t, raw, sh.lut[0], sh.lamlut[0], fmt, bf_emax, ke - k);
    __syncthreads();
    uint4* dst = (uint4*)(img + ((cpt_i64)blockIdx.y * gridDim.x + blockIdx.x) * CPT_IMAGE_BYTES(CPT_BM));
    for (int i = threadIdx.x; i < (int)(CPT_IMAGE_BYTES(CPT_BM) / 16); i += CPT_THREADS) dst[i] = ((const uint4*)&t)[i];
}
#endif

#if CPT_PIPE2
// ------------------------------------------------------------------------ two-step pipeline

// CPT_PIPE2 (a measurement build of gemm_rzacc_pre): pass 1 of a step of e4m3 x e4m3 (cpt_emax_bf16's
// bf16 sums X, which do not depend on the chain) runs during the previous step's pass 2, in the same
// loop, so that each warp issues two independent streams: per trip of 4 K elements, pass 2's 128 FFMA
// and count for this step and 64 HFMA2 of the next step's sums (two pairs of its K elements). The
// step then reads e_max off the sums it carries (cpt_emax_bf16_read, with c's exponent as it stands
// then). The next step's codes must be in shared memory while this step's are read, and the copy of
// the one after must land meanwhile: three stages (CptSharedPre::st, 101,376 bytes per block, two
// blocks per SM). Both sums run in cpt_sum_rzacc's and cpt_emax_bf16's order over the same operands:
// the same bits. Other formats keep pass 1 at the step's start (cpt_emax, not pipelined).

// The sums X of pass 1 over the K groups [t0, t1) (4 elements, two pairs each) of the step whose
// codes start at element kofs of stage sh's chunk, in cpt_emax_bf16's order.
__device__ __forceinline__ void cpt_emax_bf16_groups(const CptStage& sh, int ty, int tx, int kofs, int t0, int t1,
                                                     cpt_u32 (&X)[CPT_TM][CPT_TN]) {
#pragma unroll 1
    for (int t = t0; t < t1; ++t) {
        cpt_emax_bf16_pair(sh, ty, tx, kofs / 2 + 2 * t, X);
        cpt_emax_bf16_pair(sh, ty, tx, kofs / 2 + 2 * t + 1, X);
    }
}

// Pass 2 of the step of klen elements at kofs of stage sh (cpt_sum_rzacc into out), with pass 1's
// sums Xn of the next step (nklen elements at nkofs of stage shn; nklen = 0: none) in the same loop
// while both have K groups left, then whichever has groups left alone.
__device__ __forceinline__ void cpt_step_pipe2(const CptStage& sh, const CptStage& shn, int ty, int tx, int kofs,
                                               int klen, int nkofs, int nklen, const float (&acc)[CPT_TM][CPT_TN],
                                               const int (&em)[CPT_TM][CPT_TN], int F, int lmin, cpt_u32 rmask,
                                               cpt_u32 (&Xn)[CPT_TM][CPT_TN], float (&out)[CPT_TM][CPT_TN]) {
    float X[CPT_TM][CPT_TN];      // the biased accumulator
    cpt_u32 T4[CPT_TM][CPT_TN];   // T in every byte
    cpt_u32 cnt[CPT_TM][CPT_TN];  // 128 * the products to move up by one unit
    cpt_rzacc_begin(acc, em, F, lmin, X, T4, cnt);
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) Xn[i][j] = 0u;
    const int n2 = klen / 4, n1 = nklen / 4, nf = min(n2, n1);  // K groups of this step, of the next, together
#pragma unroll 1
    for (int t = 0; t < nf; ++t) {
        cpt_rzacc_group(sh, ty, tx, kofs + 4 * t, X, T4, cnt);
        cpt_emax_bf16_pair(shn, ty, tx, nkofs / 2 + 2 * t, Xn);
        cpt_emax_bf16_pair(shn, ty, tx, nkofs / 2 + 2 * t + 1, Xn);
    }
#pragma unroll 1
    for (int t = nf; t < n2; ++t) cpt_rzacc_group(sh, ty, tx, kofs + 4 * t, X, T4, cnt);
    cpt_emax_bf16_groups(shn, ty, tx, nkofs, nf, n1, Xn);
    cpt_rzacc_end(X, cnt, em, F, rmask, out);
}
#endif

#if CPT_EPROD
// ------------------------------------------------------------------------ e_max bytes

// The e_max bytes (CPT_EPROD, a measurement build): for the block of 64 x 64 outputs (blockIdx.x,
// blockIdx.y) and every step s (K elements [L s, L s + L)), the byte cpt_emax_mma leaves in emx for
// each output (cpt_emax_tile_mma): E_max of the step's products (-128 when all are zero), read from the same bf16 sum on
// the same tensor-core instruction, with the pass-1 operands (x2) of the full stage images Pa and Pb
// (cpemu_rzacc_predecode built with CPT_STAGE_PASS1=1: 260 bytes per row, x2 after v, lam and sg).
// Written in the GEMM threads' order (cpt_copy_eprod). e4m3 x e4m3 only; grid (ceil(N / 64),
// ceil(M / 64)), CPT_THREADS threads.
#define CPT_FULL_IMAGE_BYTES (260 * CPT_BM)
#define CPT_FULL_IMAGE_X2 ((CPT_KT * 4 + 2 * CPT_KT) * CPT_BM)
__device__ __forceinline__ void cpt_eprod_body(const cpt_u8* __restrict__ Pa, const cpt_u8* __restrict__ Pb,
                                               int nchunks, int K, int L, int nsteps, cpt_u8* __restrict__ Ep) {
    __shared__ __align__(16) cpt_u32 xa[CPT_KT / 2][CPT_BM];
    __shared__ __align__(16) cpt_u32 xb[CPT_KT / 2][CPT_BN];
    __shared__ __align__(16) signed char emx[CPT_BM][CPT_BN];
    const int ty = threadIdx.x / (CPT_BN / CPT_TN), tx = threadIdx.x % (CPT_BN / CPT_TN);
    const cpt_i64 blk = (cpt_i64)blockIdx.y * gridDim.x + blockIdx.x;
    for (int ch = 0; ch < nchunks; ++ch) {
        const uint4* pa = (const uint4*)(Pa + ((cpt_i64)blockIdx.y * nchunks + ch) * CPT_FULL_IMAGE_BYTES + CPT_FULL_IMAGE_X2);
        const uint4* pb = (const uint4*)(Pb + ((cpt_i64)blockIdx.x * nchunks + ch) * CPT_FULL_IMAGE_BYTES + CPT_FULL_IMAGE_X2);
        __syncthreads();  // the previous chunk's operands and bytes are read
        for (int i = threadIdx.x; i < (int)(sizeof(xa) / 16); i += CPT_THREADS) {
            ((uint4*)xa)[i] = pa[i];
            ((uint4*)xb)[i] = pb[i];
        }
        __syncthreads();
        for (int kofs = 0; kofs < CPT_KT && ch * CPT_KT + kofs < K; kofs += L) {
            cpt_emax_tile_mma(xa, xb, kofs, min(L, K - ch * CPT_KT - kofs), emx);
            __syncthreads();
            cpt_u32 w[CPT_TM];  // this GEMM thread's rows, 4 columns each
#pragma unroll
            for (int i = 0; i < CPT_TM; ++i) w[i] = *(const cpt_u32*)&emx[ty * CPT_TM + i][tx * CPT_TN];
            uint4* dst = (uint4*)(Ep + ((blk * nsteps + (ch * CPT_KT + kofs) / L) * CPT_THREADS + threadIdx.x) * 32);
            dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
            dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
            __syncthreads();  // emx is read before the next step writes it
        }
    }
}
static_assert(CPT_TM == 8 && CPT_TN == 4 && CPT_BM == 64 && CPT_BN == 64, "CPT_EPROD: 32 bytes per GEMM thread");
#endif

// ------------------------------------------------------------------------ kernel

// The kernel's body. Same arguments as cpemu_gemm_simple (see gemm_simple.cu), plus ws: a
// float32 workspace of 2 * M * N elements for the promotion and split-K folds (read and
// written only by the thread that owns the output; may be a 1-element dummy when the plan
// has one slice of one chain, i.e. fast accumulation without split-K).
#define CPT_KERNEL_PARAMS                                                                                             \
    const cpt_u8 *__restrict__ A, const cpt_u8 *__restrict__ Bt, int M, int N, int K, int a_fmt, int b_fmt, int L,   \
        int F, int R, int e_zero, const int *__restrict__ slices, int n_slices, int promotion,                       \
        const float *__restrict__ scale_a, int sa_stride, const float *__restrict__ scale_b, int sb_stride,          \
        int ep_order, const float *__restrict__ bias, int has_bias, void *__restrict__ out, int out_kind,            \
        cpt_u32 nan_bits, float *__restrict__ ws CPT_IMAGE_PARAMS
#define CPT_KERNEL_ARGS                                                                                               \
    A, Bt, M, N, K, a_fmt, b_fmt, L, F, R, e_zero, slices, n_slices, promotion, scale_a, sa_stride, scale_b,         \
        sb_stride, ep_order, bias, has_bias, out, out_kind, nan_bits, ws CPT_IMAGE_ARGS
#if CPT_PREDECODE && CPT_EPROD  // and the e_max bytes of every step (cpemu_rzacc_eprod)
#define CPT_IMAGE_PARAMS , const cpt_u8 *__restrict__ Ai, const cpt_u8 *__restrict__ Bi, int nchunks, \
                           const cpt_u8 *__restrict__ Ep, int nsteps
#define CPT_IMAGE_ARGS , Ai, Bi, nchunks, Ep, nsteps
#elif CPT_PREDECODE  // the images of A and B (cpemu_rzacc_predecode) and their chunks per row block
#define CPT_IMAGE_PARAMS , const cpt_u8 *__restrict__ Ai, const cpt_u8 *__restrict__ Bi, int nchunks
#define CPT_IMAGE_ARGS , Ai, Bi, nchunks
#else
#define CPT_IMAGE_PARAMS
#define CPT_IMAGE_ARGS
#endif

__device__ __forceinline__ void cpt_gemm_tiled_body(CPT_KERNEL_PARAMS) {
    extern __shared__ __align__(16) unsigned char cpt_smem[];
#if CPT_PREDECODE
    CptSharedPre& sp = *reinterpret_cast<CptSharedPre*>(cpt_smem);
#else
    CptShared& sh = *reinterpret_cast<CptShared*>(cpt_smem);
#endif
#if CPT_KPARTS > 1
    const int owner = (int)threadIdx.x / CPT_KPARTS;  // the outputs' thread; CPT_PART: its part
    const int tx = owner % (CPT_BN / CPT_TN), ty = owner / (CPT_BN / CPT_TN);
#else
    const int tx = threadIdx.x % (CPT_BN / CPT_TN), ty = threadIdx.x / (CPT_BN / CPT_TN);
#endif
    const int m0 = blockIdx.y * CPT_BM, n0 = blockIdx.x * CPT_BN;
    const int fast = F <= 16;
    const int bf_emax = fast && a_fmt == 0 && b_fmt == 0;  // pass 1 by cpt_emax_bf16
    const int S0 = F - cpemu_fp8_frac_bits(a_fmt) - cpemu_fp8_frac_bits(b_fmt);
    const cpt_u32 rmask = 0xFFFFFFFFu << (23 - R);
    const cpt_i64 MN = (cpt_i64)M * N;
#if !CPT_PREDECODE
    cpt_build_luts(sh, a_fmt, b_fmt, fast, S0);
#endif

    float acc[CPT_TM][CPT_TN];  // the chain's accumulator c; at the end, the FP32 result
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) acc[i][j] = 0.0f;
    int cbad = 0;  // some accumulator of this thread may be NaN / Inf

    CpemuStep cur;  // the step's place in the schedule (cpemu_schedule.cuh)
    cpemu_step_slice(cur, slices, 0, promotion, L);
#if CPT_PIPE2
    // every step lies in one 32-element K chunk (kernels.py checks the plan); the stages of this
    // step (buf) and of the next (nbuf: the same at L = 16 when both lie in one chunk) are in place
    // at each step's start, the one after's lands during it (a ring of three)
    int buf = 0, nbuf = 0;
    cpt_copy_image<CPT_BM>(sp.st[0].a, Ai, blockIdx.y, nchunks, cur.k);
    cpt_copy_image<CPT_BN>(sp.st[0].b, Bi, blockIdx.x, nchunks, cur.k);
    cpt_cp_async_commit();
    CpemuStep next = cur;
    int more = cpemu_step_next(next, slices, n_slices, promotion, L) != 3;
    if (more && (next.k >> 5) != (cur.k >> 5)) {
        nbuf = 1;
        cpt_copy_image<CPT_BM>(sp.st[1].a, Ai, blockIdx.y, nchunks, next.k);
        cpt_copy_image<CPT_BN>(sp.st[1].b, Bi, blockIdx.x, nchunks, next.k);
        cpt_cp_async_commit();
    }
    cpt_u32 Xn[CPT_TM][CPT_TN];  // pass 1's sums of the step about to run (bf_emax)
    cpt_cp_async_wait();
    __syncthreads();  // the first step's stage has landed
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) Xn[i][j] = 0u;
    if (bf_emax) cpt_emax_bf16_groups(sp.st[0], ty, tx, cur.k & (CPT_KT - 1), 0, (cur.ke - cur.k) / 4, Xn);
#elif CPT_PREDECODE
    // every step lies in one 32-element K chunk (kernels.py checks the plan)
    int buf = 0;
    cpt_copy_image<CPT_BM>(sp.st[0].a, Ai, blockIdx.y, nchunks, cur.k);
    cpt_copy_image<CPT_BN>(sp.st[0].b, Bi, blockIdx.x, nchunks, cur.k);
#if CPT_EPROD
    cpt_copy_eprod(sp, Ep, nsteps, cur.k / L);
#endif
    cpt_cp_async_commit();
#else
    uint2 ra[CPT_LOADS(CPT_BM)], rb[CPT_LOADS(CPT_BN)];
    cpt_fetch<CPT_BM>(A, M, K, m0, cur.k, cur.ke, ra);
    cpt_fetch<CPT_BN>(Bt, N, K, n0, cur.k, cur.ke, rb);
    const CptStage& st = sh.st;
#endif
    for (;;) {
        const int s = cur.s, k = cur.k, ke = cur.ke, k0 = cur.k0, k1 = cur.k1, cstart = cur.cstart, cend = cur.cend;
#if CPT_PIPE2
        const int kofs = k & (CPT_KT - 1);
        cpt_cp_async_wait();
        __syncthreads();  // the next step's stage has landed; every thread is done with the previous step
        const CptStage& st = sp.st[buf];
        const CptStage& stn = sp.st[nbuf];
        // the step after the next one: its stage (if a new chunk) goes to the ring's slot after nbuf,
        // which neither this step nor the next reads (buf and nbuf are equal or adjacent)
        CpemuStep next2 = next;
        const int more2 = more && cpemu_step_next(next2, slices, n_slices, promotion, L) != 3;
        int nbuf2 = nbuf;
        if (more2 && (next2.k >> 5) != (next.k >> 5)) {
            nbuf2 = nbuf == 2 ? 0 : nbuf + 1;
            cpt_copy_image<CPT_BM>(sp.st[nbuf2].a, Ai, blockIdx.y, nchunks, next2.k);
            cpt_copy_image<CPT_BN>(sp.st[nbuf2].b, Bi, blockIdx.x, nchunks, next2.k);
            cpt_cp_async_commit();
        }
#elif CPT_PREDECODE
        const int kofs = k & (CPT_KT - 1);
        cpt_cp_async_wait();
        __syncthreads();  // this step's stage has landed; every thread is done with the other one
        const CptStage& st = sp.st[buf];
        CpemuStep next = cur;
        const int more = cpemu_step_next(next, slices, n_slices, promotion, L) != 3;
        if (more && (next.k >> 5) != (k >> 5)) {  // a step in the same chunk (L = 16) reads this stage again
            cpt_copy_image<CPT_BM>(sp.st[buf ^ 1].a, Ai, blockIdx.y, nchunks, next.k);
            cpt_copy_image<CPT_BN>(sp.st[buf ^ 1].b, Bi, blockIdx.x, nchunks, next.k);
            cpt_cp_async_commit();
            buf ^= 1;
        }
#else
        const int kofs = 0;
        __syncthreads();  // the previous step is done with the stage (and the LUTs are built)
#if CPT_RZACC
        cpt_store(sh.st.a, ra, sh.lut[0], sh.lamlut[0], a_fmt, bf_emax, ke - k);
        cpt_store(sh.st.b, rb, sh.lut[1], sh.lamlut[1], b_fmt, bf_emax, ke - k);
#else
        cpt_store(sh.st.a, ra, sh.lut[0], nullptr, a_fmt, bf_emax, ke - k);
        cpt_store(sh.st.b, rb, sh.lut[1], nullptr, b_fmt, bf_emax, ke - k);
#endif
        __syncthreads();

        // prefetch the next step's codes while this one computes
        CpemuStep next = cur;
        const int more = cpemu_step_next(next, slices, n_slices, promotion, L) != 3;
        if (more) {
            cpt_fetch<CPT_BM>(A, M, K, m0, next.k, next.ke, ra);
            cpt_fetch<CPT_BN>(Bt, N, K, n0, next.k, next.ke, rb);
        }
#endif

        if (k == cstart) {  // a chain starts from +0
#pragma unroll
            for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
                for (int j = 0; j < CPT_TN; ++j) acc[i][j] = 0.0f;
            cbad = 0;
        }

        // ---- one T-FDPA step over K elements [k, ke) for the thread's outputs
        const int klen = ke - k;
        // NaN / Inf first (they depend on c and the codes only): 2 bits per output
        cpt_u64 ov = 0;  // 2 bits per output (CPT_TM * CPT_TN <= 32)
        {
            cpt_u32 fl = 0;
#pragma unroll
            for (int i = 0; i < CPT_TM; ++i) fl |= st.a.flag[ty * CPT_TM + i];
#pragma unroll
            for (int j = 0; j < CPT_TN; ++j) fl |= st.b.flag[tx * CPT_TN + j];
            if (fl | cbad) {
#pragma unroll 1
                for (int o = 0; o < CPT_TM * CPT_TN; ++o) {
                    const int i = o / CPT_TN, j = o % CPT_TN;
                    const int gm = m0 + ty * CPT_TM + i, gn = n0 + tx * CPT_TN + j;
                    float c = 0.0f;
#pragma unroll
                    for (int q = 0; q < CPT_TM * CPT_TN; ++q)
                        if (q == o) c = acc[q / CPT_TN][q % CPT_TN];
                    if (gm < M && gn < N &&
                        ((st.a.flag[ty * CPT_TM + i] | st.b.flag[tx * CPT_TN + j]) ||
                         (__float_as_uint(c) & 0x7F800000u) == 0x7F800000u))
                        ov |= (cpt_u64)cpt_specials(c, A + (cpt_i64)gm * K, Bt + (cpt_i64)gn * K, k, ke, a_fmt, b_fmt)
                              << (2 * o);
                }
                cbad = ov != 0;
            }
        }
        int em[CPT_TM][CPT_TN];
#if CPT_PIPE2
        if (bf_emax) {  // from the sums the previous step (or the prologue) left in Xn
#pragma unroll
            for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
                for (int j = 0; j < CPT_TN; ++j) em[i][j] = cpt_emax_bf16_read(Xn[i][j], acc[i][j]);
        } else {
            cpt_emax(st, ty, tx, kofs, klen, acc, em);
        }
#elif CPT_EPROD
        {  // e_max of the products from the bytes cpemu_rzacc_eprod wrote (its step k / L), then the next step's
            const uint4 w0 = *(const uint4*)&sp.ep[threadIdx.x][0], w1 = *(const uint4*)&sp.ep[threadIdx.x][4];
            const cpt_u32 w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
            for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
                for (int j = 0; j < CPT_TN; ++j) em[i][j] = max(cpt_c_exp(acc[i][j]), (int)(signed char)(w[i] >> (8 * j)));
            if (more) {  // this thread's own bytes only: ep is free once em holds them
                cpt_copy_eprod(sp, Ep, nsteps, next.k / L);
                cpt_cp_async_commit();
            }
        }
#else
        if (CPT_PROBE_SKIP & 1) {
#pragma unroll
            for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
                for (int j = 0; j < CPT_TN; ++j) em[i][j] = max(cpt_c_exp(acc[i][j]), 4);
        }
#if CPT_STAGE_PASS1
        else if (bf_emax) {
#if CPT_PASS1_MMA
            cpt_emax_mma(st, sp.emx, ty, tx, kofs, klen, acc, em);
#else
            if (CPT_FIXED_L > 0 && klen == CPT_FIXED_L) {
                cpt_emax_bf16<CPT_FIXED_L>(st, ty, tx, kofs, klen, acc, em);
            } else {
                cpt_emax_bf16<0>(st, ty, tx, kofs, klen, acc, em);
            }
#endif
#if CPT_PROBE_MMA > 0
            {  // the cost of issuing tensor-core instructions at all (benchmarks/README.md, "Any
               // tensor-core instruction lowers the SM clock"): CPT_PROBE_MMA MMAs of operands that
               // are 0 at run time, whose result changes nothing
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                const cpt_u32 z = (cpt_u32)klen >> 20;
#pragma unroll
                for (int r = 0; r < CPT_PROBE_MMA; ++r)
                    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                                 "{%4, %4, %4, %4}, {%4, %4}, {%0, %1, %2, %3};"
                                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                                 : "r"(z));
                if (__float_as_uint(d[0]) == 0x7F7FFFFFu) acc[0][0] = 1.0f;  // never: keeps the MMAs
            }
#endif
        } else {
            cpt_emax(st, ty, tx, kofs, klen, acc, em);
#if CPT_LEAN
            cpt_emax_to_bits(em);
#endif
        }
#endif
#endif  // CPT_EPROD
#if CPT_PIPE2  // this step's pass 2 and, for bf_emax, the next step's pass 1 (into Xn)
        cpt_step_pipe2(st, stn, ty, tx, kofs, klen, next.k & (CPT_KT - 1), more && bf_emax ? next.ke - next.k : 0, acc,
                       em, F, cpt_lambda_min(a_fmt) + cpt_lambda_min(b_fmt), rmask, Xn, acc);
#elif CPT_RZACC
        if (CPT_FIXED_L > 0 && klen == CPT_FIXED_L) {
            cpt_sum_rzacc<CPT_FIXED_L>(st, ty, tx, kofs, klen, acc, em, F, cpt_lambda_min(a_fmt) + cpt_lambda_min(b_fmt),
                                       rmask, acc);
        } else {
            cpt_sum_rzacc<0>(st, ty, tx, kofs, klen, acc, em, F, cpt_lambda_min(a_fmt) + cpt_lambda_min(b_fmt), rmask,
                             acc);
        }
#if CPT_LEAN
        // the step's rounding to R fraction bits, deferred to the chain's end: a chain's next step truncates
        // c at its e_max - F >= e_c - R, which gives the same bits with or without it (cpemu.rzacc_twin.step,
        // rounded=False), and the rounding keeps c's exponent and its NaN / Inf checks
        if (ke == cend) {
#pragma unroll
            for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
                for (int j = 0; j < CPT_TN; ++j) acc[i][j] = __uint_as_float(__float_as_uint(acc[i][j]) & rmask);
        }
#endif
#else
        if (fast) {
            cpt_sum_fast(st, ty, tx, klen, acc, em, F, rmask, acc);
        } else {
            cpt_sum_int(st, ty, tx, klen, acc, em, F, R, e_zero, acc);
        }
#endif
        if (ov) {
#pragma unroll
            for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
                for (int j = 0; j < CPT_TN; ++j) {
                    const cpt_u32 cl = (cpt_u32)(ov >> (2 * (i * CPT_TN + j))) & 3u;
                    if (cl) acc[i][j] = __uint_as_float(cl == 1 ? 0x7F800000u : cl == 2 ? 0xFF800000u : 0x7FFFFFFFu);
                }
        }

        // ---- schedule: fold a finished chain into its slice (p), a finished slice into the
        // result (part); both live in ws unless the fold is trivial
        if (ke == cend) {
            const int one_chain = cstart == k0 && cend == k1;
            const int last_slice = s == n_slices - 1;
#pragma unroll
            for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
                for (int j = 0; j < CPT_TN; ++j) {
                    const int gm = m0 + ty * CPT_TM + i, gn = n0 + tx * CPT_TN + j;
                    if (gm >= M || gn >= N) continue;
#if CPT_KPARTS > 1
                    if (CPT_PART != 0) continue;  // part 0 folds; the others take its result below
#endif
                    const cpt_i64 idx = (cpt_i64)gm * N + gn;
                    float pv = acc[i][j];
                    if (!one_chain) {
                        if (cstart != k0) pv = cpemu_fadd_rn(ws[idx], pv);  // p + part, in chain order
                        if (cend != k1) ws[idx] = pv;
                    }
                    if (cend == k1 && n_slices > 1) {
                        if (s != 0) pv = cpemu_fadd_rn(ws[MN + idx], pv);  // partial + p, in slice order
                        if (!last_slice) ws[MN + idx] = pv;
                    }
                    acc[i][j] = pv;  // the value that stands when this was the last fold
                }
#if CPT_KPARTS > 1
            // the other parts take part 0's folded accumulators (they read no ws)
#pragma unroll
            for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
                for (int j = 0; j < CPT_TN; ++j)
                    acc[i][j] = __shfl_sync(0xFFFFFFFFu, acc[i][j], (int)(threadIdx.x & 31u) & ~(CPT_KPARTS - 1));
#endif
        }
        if (!more) break;
        cur = next;
#if CPT_PIPE2
        next = next2;
        more = more2;
        buf = nbuf;
        nbuf = nbuf2;
#endif
    }

    // ---- epilogue (acc holds the FP32 accumulator of the whole GEMM)
#if CPT_KPARTS > 1
    if (CPT_PART != 0) return;  // part 0 writes the outputs
#endif
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i) {
        const int gm = m0 + ty * CPT_TM + i;
        if (gm >= M) continue;
        const float sa = scale_a[(cpt_i64)gm * sa_stride];
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) {
            const int gn = n0 + tx * CPT_TN + j;
            if (gn >= N) continue;
            const float y = cpemu_epilogue(acc[i][j], sa, scale_b[(cpt_i64)gn * sb_stride], has_bias,
                                         has_bias ? bias[gn] : 0.0f, ep_order);
            const cpt_u32 bits = cpt_encode(y, out_kind, nan_bits);
            const cpt_i64 idx = (cpt_i64)gm * N + gn;
            if (out_kind == CPEMU_OUT_F32) {
                ((cpt_u32*)out)[idx] = bits;
            } else {
                ((cpt_u16*)out)[idx] = (cpt_u16)bits;
            }
        }
    }
}
