// cpemu: the simple exact FP8 GEMM kernels -- one or two outputs per thread.
//
// cpemu_gemm_simple, the per-output kernel (any instruction model), is meant to be read
// side by side with cpemu/reference.py: every device
// function below has the name of the reference function it implements (tfdpa, chain,
// accumulate, epilogue, _split_fp32, _round_sum, _specials; the kernels share the epilogue,
// _split_fp32 and _round_sum from cpemu_fp32.cuh and _specials' rule from cpemu_fp8.cuh) and
// follows it line by line,
// with scalars where the reference has arrays. The arithmetic of a T-FDPA step is integer
// arithmetic; the only floating-point operations are the IEEE round-to-nearest FP32 adds
// and multiplies of the schedule and the epilogue (promotion adds, split-K reduction adds,
// scales, bias), written as explicit PTX add.rn.f32 / mul.rn.f32 (cpemu_fadd_rn,
// cpemu_fmul_rn in cpemu_fp32.cuh, with the epilogue and the output conversions) so that
// neither multiply-add contraction nor flush-to-zero can change them. Nothing here depends
// on the GPU's own FP8 hardware.
//
// Build: NVRTC, no system header (built-in types, intrinsics and PTX only); the bits do not
// depend on -ftz or --fmad (every FP32 operation is a PTX instruction without .ftz).
//
// Kernels: cpemu_gemm_simple (arguments documented at the kernel; the launch wrapper is
// cpemu/cuda/kernels.py) and, after it, cpemu_gemm_simple_staged (same arguments and bits,
// for Ada and Hopper models: the block's outputs share each step's decoded codes in shared
// memory, and the step's terms are truncated by FP32 round-toward-zero multiplies).

#include "cpemu_fp32.cuh"
#include "cpemu_fp8.cuh"
#include "cpemu_schedule.cuh"

typedef unsigned char cps_u8;
typedef unsigned int cps_u32;
typedef long long cps_i64;
typedef unsigned long long cps_u64;

// Exponent given to zero operands (reference.ZERO_EXP): a product with a zero factor lies
// far below every e_zero and every nonzero product, so it never sets e_max.
#define CPS_ZERO_EXP (-1000)

// ------------------------------------------------------------------------ formats

// A decoded FP8 code (formats._build_tables): value = sign * m * 2**(e - frac_bits);
// NaN and Inf codes have m = 0; e_nz is e, or ZERO_EXP when m == 0 (reference.Operand).
struct CpsOperand {
    int sign;  // +1 / -1 (bit 7 of the code, for every code)
    int m;     // integer significand with the hidden bit; 0 for zero, NaN, Inf
    int e;     // unbiased exponent (1 - bias for subnormals)
    int e_nz;  // e, or CPS_ZERO_EXP when m == 0
    int nan;
    int inf;
};

// cpemu_fp8.cuh's decode, plus e_nz
__device__ __forceinline__ CpsOperand cps_decode(cps_u32 code, int is_e5m2) {
    CpsOperand op;
    cpemu_fp8_decode(code, is_e5m2, &op.sign, &op.m, &op.e, &op.nan, &op.inf);
    op.e_nz = op.m == 0 ? CPS_ZERO_EXP : op.e;
    return op;
}

// ------------------------------------------------------------------------ one step

// reference._specials (cpemu_fp8_specials) applied to the step's result `out`: NaN
// (0x7FFFFFFF) or +-inf where a NaN or Inf term decides it; otherwise `out` is kept.
__device__ __forceinline__ float cps_specials(float out, float c, const cps_u8* arow, const cps_u8* brow, int k0,
                                              int k1, int a_e5m2, int b_e5m2) {
    int nan, pos, neg;
    cpemu_fp8_specials(c, arow, brow, k0, k1, a_e5m2, b_e5m2, &nan, &pos, &neg);
    if (pos) out = __uint_as_float(0x7F800000u);
    if (neg) out = __uint_as_float(0xFF800000u);
    if (nan) out = __uint_as_float(0x7FFFFFFFu);
    return out;
}

// reference.tfdpa for one output: c + sum over k in [k0, k1) of a[k] * b[k] (k1 - k0 <= L;
// missing products of a short step are zero products, which change nothing).
//   S0 = F - fa - fb;  P = (m_a << S0) * m_b;  E = e_a + e_b
//   e_max = max(E over the products, exponent of c)
//   S = sum sign * (P >> min(e_max - E, 31)) + sign_c * (m_c truncated likewise)
//   result = S * 2**(e_max - F) rounded toward zero to R fraction bits
__device__ float cps_tfdpa(float c, const cps_u8* arow, const cps_u8* brow, int k0, int k1, int a_e5m2, int b_e5m2,
                           int F, int R, int e_zero) {
    const int S0 = F - cpemu_fp8_frac_bits(a_e5m2) - cpemu_fp8_frac_bits(b_e5m2);
    int cs, ce;
    cps_i64 cm;
    cpemu_split_fp32(c, e_zero, &cs, &cm, &ce);
    // e_max = max(E.max(axis=-1), ce)
    int e_max = ce;
    int special = 0;
    for (int k = k0; k < k1; ++k) {
        const CpsOperand a = cps_decode(arow[k], a_e5m2);
        const CpsOperand b = cps_decode(brow[k], b_e5m2);
        e_max = max(e_max, a.e_nz + b.e_nz);
        special |= a.nan | a.inf | b.nan | b.inf;
    }
    // T = P >> min(e_max - E, 31); S = sum of sign * T (exact in int64)
    cps_i64 S = 0;
    for (int k = k0; k < k1; ++k) {
        const CpsOperand a = cps_decode(arow[k], a_e5m2);
        const CpsOperand b = cps_decode(brow[k], b_e5m2);
        const int P = (a.m << S0) * b.m;
        const int E = a.e_nz + b.e_nz;
        const int shift = min(e_max - E, 31);
        const int T = P >> shift;
        S += (cps_i64)(a.sign * b.sign * T);
    }
    // the accumulator's 24-bit significand, truncated likewise
    const int rc = e_max - ce + (23 - F);
    S += (cps_i64)cs * (rc >= 0 ? (cm >> min(rc, 62)) : (cm << min(-rc, 62)));
    float out = cpemu_round_sum(S, e_max - F, R);
    const cps_u32 cb = __float_as_uint(c);
    if (special || (cb & 0x7F800000u) == 0x7F800000u) out = cps_specials(out, c, arow, brow, k0, k1, a_e5m2, b_e5m2);
    return out;
}

// reference.chain: steps over K elements [k0, k1) in ascending order, L at a time, from +0.
__device__ float cps_chain(const cps_u8* arow, const cps_u8* brow, int k0, int k1, int a_e5m2, int b_e5m2, int L,
                           int F, int R, int e_zero) {
    float c = 0.0f;
    for (int k = k0; k < k1; k += L) c = cps_tfdpa(c, arow, brow, k, min(k + L, k1), a_e5m2, b_e5m2, F, R, e_zero);
    return c;
}

// reference.accumulate: each slice from zero (one chain with fast accumulation, else
// chains of `promotion` steps added into an FP32 accumulator with RN adds), slice
// partials added in slice order with FP32 RN adds.
__device__ float cps_accumulate(const cps_u8* arow, const cps_u8* brow, const int* slices, int n_slices,
                                int promotion, int a_e5m2, int b_e5m2, int L, int F, int R, int e_zero) {
    float partial = 0.0f;
    for (int s = 0; s < n_slices; ++s) {
        const int k0 = slices[2 * s], k1 = slices[2 * s + 1];
        float p = 0.0f;
        if (promotion <= 0) {
            p = cps_chain(arow, brow, k0, k1, a_e5m2, b_e5m2, L, F, R, e_zero);
        } else {
            const int step = promotion * L;
            for (int k = k0; k < k1; k += step) {
                const float part = cps_chain(arow, brow, k, min(k + step, k1), a_e5m2, b_e5m2, L, F, R, e_zero);
                p = k == k0 ? part : cpemu_fadd_rn(p, part);  // float32 + float32: IEEE RN
            }
        }
        partial = s == 0 ? p : cpemu_fadd_rn(partial, p);
    }
    return partial;
}

// ------------------------------------------------------------------------ kernel

// formats.encode_output of one epilogue result y into out[idx] (NaN -> nan_bits).
__device__ __forceinline__ void cps_store(void* out, cps_i64 idx, float y, int out_kind, cps_u32 nan_bits) {
    if (out_kind == CPEMU_OUT_F32) {
        const cps_u32 u = __float_as_uint(y);
        ((cps_u32*)out)[idx] = (u & 0x7FFFFFFFu) > 0x7F800000u ? nan_bits : u;
    } else if (out_kind == CPEMU_OUT_BF16) {
        ((unsigned short*)out)[idx] = (unsigned short)cpemu_encode_bf16(y, nan_bits);
    } else {
        ((unsigned short*)out)[idx] = (unsigned short)cpemu_encode_f16(y, nan_bits);
    }
}

// out[m, n] for every output (grid-stride loop over M*N):
//   A (M, K) and Bt (N, K) uint8 FP8 codes, row-major (Bt is B transposed: K contiguous);
//   a_fmt / b_fmt: 0 = e4m3, 1 = e5m2;
//   L, F, R, e_zero: the instruction model (products per step, fraction bits kept below
//     e_max, result fraction bits: 13 for RZ-E8M13, 23 for RZ-FP32, zero exponent);
//   slices: n_slices pairs (k0, k1) of the plan; promotion: steps per promoted chain, 0 for
//     fast accumulation;
//   scale_a[m * sa_stride], scale_b[n * sb_stride] (stride 0: tensorwise); ep_order: one of
//     CPEMU_EP_*; bias[n] (float32) when has_bias;
//   out: float32 bits (out_kind 0) or uint16 bf16 / fp16 bits (1 / 2); NaN -> nan_bits.
extern "C" __global__ void cpemu_gemm_simple(const cps_u8* __restrict__ A, const cps_u8* __restrict__ Bt, int M, int N,
                                             int K, int a_fmt, int b_fmt, int L, int F, int R, int e_zero,
                                             const int* __restrict__ slices, int n_slices, int promotion,
                                             const float* __restrict__ scale_a, int sa_stride,
                                             const float* __restrict__ scale_b, int sb_stride, int ep_order,
                                             const float* __restrict__ bias, int has_bias, void* __restrict__ out,
                                             int out_kind, cps_u32 nan_bits) {
    const cps_i64 total = (cps_i64)M * N;
    for (cps_i64 idx = (cps_i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (cps_i64)gridDim.x * blockDim.x) {
        const int m = (int)(idx / N), n = (int)(idx % N);
        const cps_u8* arow = A + (cps_i64)m * K;
        const cps_u8* brow = Bt + (cps_i64)n * K;
        const float acc = cps_accumulate(arow, brow, slices, n_slices, promotion, a_fmt, b_fmt, L, F, R, e_zero);
        const float y = cpemu_epilogue(acc, scale_a[(cps_i64)m * sa_stride], scale_b[(cps_i64)n * sb_stride], has_bias,
                                     has_bias ? bias[n] : 0.0f, ep_order);
        cps_store(out, idx, y, out_kind, nan_bits);
    }
}

// ======================================================================== staged kernel
//
// cpemu_gemm_simple_staged: the same outputs, two per thread (CPS_TN), for the instruction
// models with 11 <= F <= 16 (Ada, Hopper: F = 13; kernels.py picks the kernel). The threads of
// a block (CPS_BM x CPS_BN outputs) run the same steps in the same order, so each step's FP8
// codes of the block's CPS_BM rows of A and CPS_BN rows of Bt are decoded once into
// shared memory (cps_stage: the value times 2**-CPS_SHIFT in FP32, and e_nz as one byte;
// the next step's codes load while this one computes), and each thread computes
// reference.tfdpa for each of its outputs from there (cps_tfdpa_staged; its two outputs share
// the row of A, whose staged values it loads once):
//
//   e_max = max(e_a + e_b, exponent of c), as in cps_tfdpa;
//   every term (each product, and c) is multiplied by 2**(F - 149 - e_max). That puts the
//   step's terms and all their partial sums below 2**-125 in magnitude (|product| <
//   2**(e_max + 2), |c| < 2**(e_max + 1), at most 32 products, F <= 16), where the FP32
//   values are exactly the multiples of 2**-149 (the subnormals and the lowest normal
//   binade). So one IEEE round-toward-zero multiply truncates each term toward zero to the
//   grid 2**(e_max - F) -- sign * (P >> (e_max - E)) of cps_tfdpa, for either sign -- and
//   the truncated terms add exactly with round-to-nearest adds, in any order. The sum's
//   encoding is then S of cps_tfdpa (sign and magnitude in units of 2**-149), and
//   cpemu_round_sum(S, e_max - F, R) is the exact product S * 2**(e_max - F) (two exact FP32
//   multiplies of the sum; S has at most 23 bits) rounded toward zero to R fraction bits
//   with the floor at 2**-126: the low 23 - R bits of its encoding cleared.
//
// The products a * b are exact FP32 multiplies of the staged values (8 significant bits;
// with the 2**-58 of each operand they lie in [2**-148, 2**-84)), so a product's term takes
// three FP32 instructions (multiply, round-toward-zero multiply, add) and no integer work.
// Only IEEE-defined operations with explicit rounding (PTX mul.rn, mul.rz, add.rn without
// .ftz) and integer operations are used: the bits do not depend on the GPU.
//
// Bounds the step relies on: a finite c of a step is 0 or in [2**-44, 2**63). Below: a
// step with a nonzero product has e_max >= -28 (e_a + e_b >= -28), so its nonzero result
// is at least 2**(e_max - F) >= 2**-44 (F <= 16); a step whose only nonzero term is c keeps
// c's leading bit. Above: |c| is at most the sum of |a * b| over the chain, below 2**32 * K.
// So whenever the result can be nonzero, -44 <= e_max < 63; e_max is taken at least
// CPS_EMAX_FLOOR = -64, and the powers of two below are then normal FP32 numbers, built from
// their exponent alone.
//
// NaN/Inf: the stage records per row whether the step's codes hold a NaN or an Inf, and the
// block learns at the stage's barrier whether any row does. Then those outputs (and those
// whose accumulator is not finite, for the rest of the chain) are finished by cps_specials,
// which rereads the codes. Launch: grid (ceil(N / CPS_BN), ceil(M / CPS_BM)), CPS_THREADS
// threads (the geometry below); K, the slice bounds and L multiples of 8 and L <= CPS_KT
// (kernels.py checks).

// Geometry: 32 x 32 outputs per block, CPS_TN per thread along N (columns tx and tx + 16):
// 512 threads, two blocks per SM on every architecture (64 registers per thread). kernels.py
// reads the block size back from the kernel (its maximum threads per block); CPS_TN=1 builds
// the one-output-per-thread form of before (1024 threads), for comparison.
#ifndef CPS_TN
#define CPS_TN 2  // outputs per thread along N: 1 or 2
#endif
#ifndef CPS_MINBLOCKS
#define CPS_MINBLOCKS 2  // __launch_bounds__: resident blocks per SM the registers must allow
#endif
#define CPS_BM 32                             // outputs per block along M
#define CPS_BN 32                             // outputs per block along N
#define CPS_THREADS (CPS_BM * CPS_BN / CPS_TN)  // a warp takes 4 rows x 8 thread columns
#define CPS_TCOLS (CPS_BN / CPS_TN)           // thread columns per block; thread column tx has outputs tx + j * CPS_TCOLS
#define CPS_ROWS (CPS_BM + CPS_BN)            // staged rows: the block's rows of A, then of Bt
#define CPS_KT 32                             // K elements per stage: the largest L
#define CPS_VSTRIDE 36                        // floats per staged row: 16-byte loads of 8 rows hit 32 banks
#define CPS_ESTRIDE 48                        // exponent bytes per staged row (likewise)
#define CPS_SHIFT 58                          // staged values are value * 2**-CPS_SHIFT
#define CPS_EBIAS 112                         // staged exponent byte: e_nz + CPS_EBIAS, 0 for zero codes
#define CPS_EMAX_FLOOR (-64)                  // the least e_max a step uses (see above)
#define CPS_PAST_END 0x100u                   // CpsStaged.special: the row is past the last of A or Bt

static_assert(CPS_TN == 1 || CPS_TN == 2, "staged geometry: kernels.py derives the block from its threads "
              "(1024 / CPS_TN)");
static_assert(CPS_ROWS * CPS_KT / 4 <= CPS_THREADS, "cps_stage: at most one 4-code chunk per thread");

struct CpsStaged {
    float v[CPS_ROWS][CPS_VSTRIDE];          // value * 2**-58 (0 for zero, NaN and Inf codes)
    unsigned char e[CPS_ROWS][CPS_ESTRIDE];  // e_nz + CPS_EBIAS (0 for zero, NaN and Inf codes)
    cps_u32 special[CPS_ROWS];               // a NaN or Inf among the row's codes of the step; CPS_PAST_END
    uint2 lut[2][256];  // per operand (0: A, 1: B) and code: .x bits of v, .y e byte | NaN/Inf << 16
};

// 2**t as FP32 bits, for -149 <= t <= 127 (subnormal below -126).
__device__ __forceinline__ cps_u32 cps_pow2(int t) {
    return t >= -126 ? (cps_u32)(t + 127) << 23 : 1u << (t + 149);
}

// max(a, b, c) per unsigned 16-bit lane: one DPX instruction on sm_90, two SIMD maxima
// elsewhere (CPS_PORTABLE_MAX=1 builds the latter on sm_90 too, so that it can be tested there).
#ifndef CPS_PORTABLE_MAX
#define CPS_PORTABLE_MAX 0
#endif
__device__ __forceinline__ cps_u32 cps_max3_u16x2(cps_u32 a, cps_u32 b, cps_u32 c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !CPS_PORTABLE_MAX
    return __vimax3_u16x2(a, b, c);
#else
    return __vmaxu2(__vmaxu2(a, b), c);
#endif
}

// 2**t for -126 <= t <= 127 (a normal number).
__device__ __forceinline__ float cps_pow2_normal(int t) {
    return __uint_as_float((cps_u32)(t + 127) << 23);
}

// The decode tables of both operands (cps_decode of every code). The exponent byte:
// e_nz + CPS_EBIAS is in [98, 127] for a nonzero finite code (e_nz in [-14, 15]), so the
// sum of two bytes is at most 254 and that of a zero code's 0 with any byte at most 127.
__device__ __forceinline__ void cps_build_lut(CpsStaged& sh, int a_e5m2, int b_e5m2) {
    for (int i = threadIdx.x; i < 512; i += CPS_THREADS) {
        const int op = i >> 8, is_e5m2 = op ? b_e5m2 : a_e5m2;
        const CpsOperand d = cps_decode((cps_u32)(i & 255), is_e5m2);
        // sign * m * 2**(e - frac_bits - 58): m < 16 converts exactly; the power of two is normal
        const float v = cpemu_fmul_rn(__int2float_rn(d.sign * d.m),
                                      __uint_as_float(cps_pow2(d.e - cpemu_fp8_frac_bits(is_e5m2) - CPS_SHIFT)));
        const cps_u32 eb = d.m == 0 ? 0u : (cps_u32)(d.e + CPS_EBIAS);
        sh.lut[op][i & 255] = make_uint2(__float_as_uint(v), eb | ((cps_u32)(d.nan | d.inf) << 16));
    }
}

// ------------------------------------------------------------------------ the stage

// This thread's chunk of the stage: 4 codes of staged row r (the block's rows of A from m0,
// then of Bt from n0), from column 4 * q. A step takes at most L codes of a row, so a row has
// cpr = 4 chunks where L <= 16, else 8 (CPS_KT / 4), and thread t takes chunk q = t % cpr of row
// r = t / cpr: with Ada's L = 16 half the threads (whole warps) stage nothing and the stage's
// second half stays unused (cps_tfdpa_staged<16> reads the first 16 codes of a row only).
struct CpsChunk {
    const cps_u8* src;  // the codes of row r from column 4 * q, or nullptr past the last row of A or Bt
    int r;              // staged row, or -1: this thread has no chunk
    int q;              // chunk of the row
    int cpr;            // chunks per row: 4 or 8
};

__device__ __forceinline__ CpsChunk cps_chunk(const cps_u8* __restrict__ A, const cps_u8* __restrict__ Bt, int M,
                                              int N, int K, int m0, int n0, int L) {
    CpsChunk ch;
    ch.cpr = L <= 16 ? 4 : CPS_KT / 4;
    ch.r = threadIdx.x / ch.cpr;
    ch.q = threadIdx.x % ch.cpr;
    ch.src = nullptr;
    if (ch.r >= CPS_ROWS) {
        ch.r = -1;
        return ch;
    }
    const int is_b = ch.r >= CPS_BM;
    const int row = is_b ? n0 + ch.r - CPS_BM : m0 + ch.r;
    if (row < (is_b ? N : M)) ch.src = (is_b ? Bt : A) + (cps_i64)row * K + 4 * ch.q;
    return ch;
}

// This thread's chunk of the stage for K elements [k, ke) (ke - k a multiple of 8, at most
// L): zero codes past ke and past the last row.
__device__ __forceinline__ cps_u32 cps_fetch(const CpsChunk& ch, int k, int ke) {
    return ch.src != nullptr && k + 4 * ch.q < ke ? __ldg((const cps_u32*)(ch.src + k)) : 0u;
}

// Decode this thread's chunk w (cps_fetch) into the stage; nonzero when it holds a NaN or Inf.
__device__ __forceinline__ cps_u32 cps_stage(CpsStaged& sh, cps_u32 w, const CpsChunk& ch) {
    if (ch.r < 0) return 0u;  // whole warps: CPS_ROWS * cpr is a multiple of 32
    const uint2* lut = sh.lut[ch.r >= CPS_BM];
    const uint2 d0 = lut[w & 0xFFu], d1 = lut[(w >> 8) & 0xFFu], d2 = lut[(w >> 16) & 0xFFu], d3 = lut[w >> 24];
    *(float4*)&sh.v[ch.r][4 * ch.q] =
        make_float4(__uint_as_float(d0.x), __uint_as_float(d1.x), __uint_as_float(d2.x), __uint_as_float(d3.x));
    *(cps_u32*)&sh.e[ch.r][4 * ch.q] =
        __byte_perm(__byte_perm(d0.y, d1.y, 0x0040), __byte_perm(d2.y, d3.y, 0x0040), 0x5410);
    // the cpr threads of a staged row are consecutive lanes of one warp
    const cps_u32 special = (d0.y | d1.y | d2.y | d3.y) >> 16;
    const cps_u32 ballot = __ballot_sync(0xFFFFFFFFu, special);
    if (ch.q == 0)
        sh.special[ch.r] = ((ballot >> (threadIdx.x & 31)) & ((1u << ch.cpr) - 1u)) |
                           (ch.src == nullptr ? CPS_PAST_END : 0u);
    return special;
}

// ------------------------------------------------------------------------ one step

// reference.tfdpa for one output over the staged step, before NaN/Inf handling (see the
// comment above the staged kernel): ea/va the output's staged row of A, eb/vb of Bt. KL: K
// elements computed, 16 or 32; codes of the stage past the step's end are zero codes, which
// change nothing.
template <int KL>
__device__ __forceinline__ float cps_tfdpa_staged(const unsigned char* ea, const unsigned char* eb, const float* va,
                                                  const float* vb, float c, int F, cps_u32 rmask) {
    // e_max = max(E.max(axis=-1), ce). The exponent bytes of 4 k add in the bytes of one word
    // (each sum <= 254: ea + eb + 2 * CPS_EBIAS, or at most 127 with a zero code); as two u16
    // lanes the word's odd bytes are the high bytes, so the lanes' maximum has the largest odd
    // byte on top whatever the even bytes hold; the even bytes are masked out
    cps_u32 mo = 0u, me = 0u;
#pragma unroll
    for (int kk = 0; kk < KL; kk += 16) {
        const uint4 x = *(const uint4*)&ea[kk], y = *(const uint4*)&eb[kk];
        const cps_u32 s0 = x.x + y.x, s1 = x.y + y.y, s2 = x.z + y.z, s3 = x.w + y.w;
        mo = cps_max3_u16x2(mo, s0, s1);
        mo = cps_max3_u16x2(mo, s2, s3);
        me = cps_max3_u16x2(me, s0 & 0x00FF00FFu, s1 & 0x00FF00FFu);
        me = cps_max3_u16x2(me, s2 & 0x00FF00FFu, s3 & 0x00FF00FFu);
    }
    const cps_u32 mb = cps_max3_u16x2((mo >> 8) & 0x00FF00FFu, me, 0u);
    // a product with a zero code has e at most 127 - 2 * CPS_EBIAS = -97, below every
    // product's e_a + e_b: it can raise e_max only when every product is zero, and then
    // also c (c = 0, or ce > -45) decides it, or the result is +0 whatever e_max is. The
    // exponent field of c less 127: -127 for c = 0 (a finite nonzero c is normal), 128 for a
    // non-finite c (finished by cps_specials)
    const int ce = (int)((__float_as_uint(c) >> 23) & 0xFFu) - 127;
    const int e_max = __vimax3_s32((int)max(mb & 0xFFFFu, mb >> 16) - 2 * CPS_EBIAS, ce, CPS_EMAX_FLOOR);
    // a product of staged values is p * 2**-116: times 2**(F - 33 - e_max) is p * 2**(F - 149 - e_max)
    const float s = cps_pow2_normal(F - 33 - e_max);
    // c * 2**(F - 149 - e_max), truncated toward zero (c * 2**-e_max is exact)
    const float c_term = cpemu_fmul_rz(cpemu_fmul_rn(c, cps_pow2_normal(-e_max)), __uint_as_float(cps_pow2(F - 149)));
    // exact sums, in any order; t1..t3 start at +0, so the sum is never -0
    float t0 = c_term, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KL; kk += 4) {
        const float4 a = *(const float4*)&va[kk], b = *(const float4*)&vb[kk];
        t0 = cpemu_fadd_rn(t0, cpemu_fmul_rz(cpemu_fmul_rn(a.x, b.x), s));
        t1 = cpemu_fadd_rn(t1, cpemu_fmul_rz(cpemu_fmul_rn(a.y, b.y), s));
        t2 = cpemu_fadd_rn(t2, cpemu_fmul_rz(cpemu_fmul_rn(a.z, b.z), s));
        t3 = cpemu_fadd_rn(t3, cpemu_fmul_rz(cpemu_fmul_rn(a.w, b.w), s));
    }
    const float sum = cpemu_fadd_rn(cpemu_fadd_rn(t0, t1), cpemu_fadd_rn(t2, t3));
    // cpemu_round_sum(S, e_max - F, R): sum = S * 2**-149, times 2**100 (exact: |sum| < 2**-125)
    // and 2**(49 + e_max - F) (exact: the product is 0 or at least 2**-60)
    return __uint_as_float(
        __float_as_uint(cpemu_fmul_rn(cpemu_fmul_rn(sum, cps_pow2_normal(100)), cps_pow2_normal(49 + e_max - F))) &
        rmask);
}

// ------------------------------------------------------------------------ kernel

// The arguments are cpemu_gemm_simple's.
extern "C" __global__ void __launch_bounds__(CPS_THREADS, CPS_MINBLOCKS)
    cpemu_gemm_simple_staged(const cps_u8* __restrict__ A, const cps_u8* __restrict__ Bt, int M, int N, int K,
                             int a_fmt, int b_fmt, int L, int F, int R, int e_zero, const int* __restrict__ slices,
                             int n_slices, int promotion, const float* __restrict__ scale_a, int sa_stride,
                             const float* __restrict__ scale_b, int sb_stride, int ep_order,
                             const float* __restrict__ bias, int has_bias, void* __restrict__ out, int out_kind,
                             cps_u32 nan_bits) {
    __shared__ __align__(16) CpsStaged sh;
    cps_build_lut(sh, a_fmt, b_fmt);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int ty = warp / (CPS_TCOLS / 8) * 4 + (lane >> 3), tx = warp % (CPS_TCOLS / 8) * 8 + (lane & 7);
    const int m0 = blockIdx.y * CPS_BM, n0 = blockIdx.x * CPS_BN;
    const CpsChunk ch = cps_chunk(A, Bt, M, N, K, m0, n0, L);
    const cps_u32 rmask = 0xFFFFFFFFu << (23 - R);
    // cps_accumulate, with the steps of all the block's outputs in step; each step's codes
    // load while the step before computes
    CpemuStep cur;  // cps_accumulate's loops, one step at a time (cpemu_schedule.cuh)
    cpemu_step_slice(cur, slices, 0, promotion, L);
    cps_u32 w = cps_fetch(ch, cur.k, cur.ke);
    // per output j (column tx + j * CPS_TCOLS): p and partial start at -0, so that adding the
    // first chain's (slice's) result gives it unchanged (a NaN aside, whose payload the output
    // does not keep)
    float c[CPS_TN], p[CPS_TN], partial[CPS_TN];
#pragma unroll
    for (int j = 0; j < CPS_TN; ++j) {
        c[j] = 0.0f;
        p[j] = -0.0f;
        partial[j] = -0.0f;
    }
    int chain_special = 0;  // a NaN or Inf code in the block's codes of the chain so far
    for (;;) {
        __syncthreads();  // the previous step's stage has been read
        chain_special |= __syncthreads_or(cps_stage(sh, w, ch));
        CpemuStep next = cur;
        const int event = cpemu_step_next(next, slices, n_slices, promotion, L);
        if (event != 3) w = cps_fetch(ch, next.k, next.ke);
#pragma unroll
        for (int j = 0; j < CPS_TN; ++j) {
            const int col = CPS_BM + tx + j * CPS_TCOLS;  // the output's staged row of Bt
            float y = L <= 16 ? cps_tfdpa_staged<16>(sh.e[ty], sh.e[col], sh.v[ty], sh.v[col], c[j], F, rmask)
                              : cps_tfdpa_staged<CPS_KT>(sh.e[ty], sh.e[col], sh.v[ty], sh.v[col], c[j], F, rmask);
            if (chain_special) {  // block-uniform
                const cps_u32 f = sh.special[ty] | sh.special[col];
                if (!(f & CPS_PAST_END) && (f || (__float_as_uint(c[j]) & 0x7F800000u) == 0x7F800000u))
                    y = cps_specials(y, c[j], A + (cps_i64)(m0 + ty) * K, Bt + (cps_i64)(n0 + col - CPS_BM) * K,
                                     cur.k, cur.ke, a_fmt, b_fmt);
            }
            c[j] = y;
            if (event != 0) {  // the chain ends (cps_chain's result): float32 + float32, IEEE RN
                p[j] = cpemu_fadd_rn(p[j], c[j]);
                c[j] = 0.0f;
                if (event != 1) {  // the slice ends
                    partial[j] = cpemu_fadd_rn(partial[j], p[j]);
                    p[j] = -0.0f;
                }
            }
        }
        if (event != 0) chain_special = 0;
        if (event == 3) break;
        cur = next;
    }
    const int m = m0 + ty;
#pragma unroll
    for (int j = 0; j < CPS_TN; ++j) {
        const int n = n0 + tx + j * CPS_TCOLS;
        if (m < M && n < N) {
            const float y = cpemu_epilogue(partial[j], scale_a[(cps_i64)m * sa_stride], scale_b[(cps_i64)n * sb_stride],
                                           has_bias, has_bias ? bias[n] : 0.0f, ep_order);
            cps_store(out, (cps_i64)m * N + n, y, out_kind, nan_bits);
        }
    }
}

