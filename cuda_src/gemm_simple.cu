// cpemu: the simple exact FP8 GEMM kernel -- one output per thread.
//
// This file is meant to be read side by side with cpemu/reference.py: every device
// function below has the name of the reference function it implements (tfdpa, chain,
// accumulate, epilogue, _split_fp32, _round_sum, _specials) and follows it line by line,
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
// Kernel: cpemu_gemm_simple (arguments documented at the kernel; the launch wrapper is
// cpemu/cuda/kernels.py).

#include "cpemu_fp32.cuh"
#include "cpemu_fp8.cuh"

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

// reference._split_fp32: FP32 c -> (sign, 24-bit integer significand, exponent) with
// c = sign * m * 2**(e - 23); subnormals keep e = -126; zero takes e_zero. NaN/Inf are
// taken as zero here (their result is decided by cps_specials).
__device__ __forceinline__ void cps_split_fp32(float c, int e_zero, int* sign, cps_i64* m, int* e) {
    const cps_u32 bits = __float_as_uint(c);
    const cps_u32 efield = (bits >> 23) & 0xFFu;
    cps_u32 frac = bits & 0x7FFFFFu;
    int ex;
    if (efield == 0xFFu) {  // np.where(np.isfinite(c64), c64, 0.0)
        frac = 0;
        ex = -126;
    } else if (efield == 0) {  // subnormal (or zero): e = -126, no hidden bit
        ex = -126;
    } else {
        frac |= 0x800000u;
        ex = (int)efield - 127;
    }
    *m = (cps_i64)frac;
    *e = frac == 0 ? e_zero : ex;
    *sign = (frac != 0 && (bits >> 31)) ? -1 : 1;
}

// An FP32 value from a sign and an integer magnitude with at most 24 significant bits:
// (-1)**neg * mag * 2**scale_exp, exactly (the caller guarantees that it is representable
// or overflows); +0 for mag == 0. This is np.ldexp(...).astype(np.float32) of _round_sum.
__device__ __forceinline__ float cps_make_f32(int neg, cps_u64 mag, int scale_exp) {
    if (mag == 0) return 0.0f;  // "+ np.float32(0.0)": -0 -> +0
    const int bl = 64 - __clzll((long long)mag);
    const int e = scale_exp + bl - 1;  // exponent of the leading bit
    cps_u32 bits;
    if (e > 127) {
        bits = 0x7F800000u;  // float64 -> float32 overflows to inf
    } else if (e >= -126) {  // normal: 24-bit significand with the hidden bit at bit 23
        const cps_u64 sig = bl > 24 ? (mag >> (bl - 24)) : (mag << (24 - bl));
        bits = ((cps_u32)(e + 127) << 23) | ((cps_u32)sig & 0x7FFFFFu);
    } else {  // subnormal: units of 2**-149
        const int sh = scale_exp + 149;
        const cps_u64 sig = sh >= 0 ? (mag << sh) : (-sh >= 64 ? 0ull : (mag >> -sh));
        bits = (cps_u32)sig;
    }
    if (neg) bits |= 0x80000000u;
    return __uint_as_float(bits);
}

// reference._round_sum: round the exact sum S * 2**scale_exp toward zero to frac_bits
// fraction bits, with exponents floored at -126; -0 -> +0.
__device__ __forceinline__ float cps_round_sum(cps_i64 S, int scale_exp, int frac_bits) {
    if (S == 0) return 0.0f;
    cps_u64 absS = (cps_u64)(S < 0 ? -S : S);
    const int bl = 64 - __clzll((long long)absS);  // bit length of |S|
    const int e_res = max(scale_exp + bl - 1, -126);
    const int drop = min(max(e_res - frac_bits - scale_exp, 0), 62);
    absS = (absS >> drop) << drop;
    return cps_make_f32(S < 0, absS, scale_exp);
}

// reference._specials: IEEE semantics for NaN/Inf terms: any NaN, inf*0, or infinities
// of both signs give NaN (0x7FFFFFFF); else +-inf; otherwise `out` is kept.
__device__ __forceinline__ float cps_specials(float out, float c, const cps_u8* arow, const cps_u8* brow, int k0,
                                              int k1, int a_e5m2, int b_e5m2) {
    int nan = 0, pos = 0, neg = 0;
    for (int k = k0; k < k1; ++k) {
        const CpsOperand a = cps_decode(arow[k], a_e5m2);
        const CpsOperand b = cps_decode(brow[k], b_e5m2);
        const int a_zero = a.m == 0 && !a.nan && !a.inf;
        const int b_zero = b.m == 0 && !b.nan && !b.inf;
        nan |= a.nan | b.nan | (a.inf & b_zero) | (a_zero & b.inf);
        const int inf_p = a.inf | b.inf;
        const int psign = a.sign * b.sign;
        pos |= inf_p && psign > 0;
        neg |= inf_p && psign < 0;
    }
    const cps_u32 cb = __float_as_uint(c);
    pos |= cb == 0x7F800000u;
    neg |= cb == 0xFF800000u;
    nan |= ((cb & 0x7FFFFFFFu) > 0x7F800000u) | (pos & neg);
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
    cps_split_fp32(c, e_zero, &cs, &cm, &ce);
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
    float out = cps_round_sum(S, e_max - F, R);
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
        if (out_kind == CPEMU_OUT_F32) {
            const cps_u32 u = __float_as_uint(y);
            ((cps_u32*)out)[idx] = (u & 0x7FFFFFFFu) > 0x7F800000u ? nan_bits : u;
        } else if (out_kind == CPEMU_OUT_BF16) {
            ((unsigned short*)out)[idx] = (unsigned short)cpemu_encode_bf16(y, nan_bits);
        } else {
            ((unsigned short*)out)[idx] = (unsigned short)cpemu_encode_f16(y, nan_bits);
        }
    }
}
