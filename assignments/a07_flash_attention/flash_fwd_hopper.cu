// Assignment 7c (advanced, optional): flash-attention forward for Hopper, the FlashAttention-3 way.
//   O = softmax(Q K^T / sqrt(d)) V and L = rowwise logsumexp, per (batch, head).
//   q, k, v, o: [B, H, S, d] bf16 contiguous, d = 64 or 128, any S >= 1; L: [B, H, S] fp32.
//   causal: query i sees keys j <= i (Nq == Nk, so bottom-right = top-left).
//
// Idea: stage 7b's Triton kernel leaves the data movement to the compiler. On Hopper the
// fast path is the one stage 6's v7 matmul took (matmul_v7_wgmma.cu), applied to attention:
//   * persistent: one CTA per SM, 3 warpgroups (384 threads), walking work tiles (a 128-row
//     query block of one b*h; heads-major, causal: longest first), handed out by an atomic
//     counter, so that the next tile's Q and K/V loads overlap this tile's end;
//   * warpgroup 0 is the producer: one thread issues TMA copies (cp.async.bulk.tensor, 3-D
//     tensor maps [B*H, S, d], so rows past S of this head are zero-filled by the copy
//     engine, never read from the next head) of each tile's Q block, then of its K and V tiles
//     into a STAGES-deep shared-memory ring that runs on across tiles. mbarriers: q_full /
//     q_empty (Q landed / the tile's last S done), k_full / v_full per slot (TMA bytes landed),
//     k_empty / v_empty (both consumers are done with the K, the V of a slot);
//   * warpgroups 1 and 2 are consumers, 64 query rows each. Per key tile of BN = 128:
//       S = Q K^T            wgmma m64n128k16, both operands from shared memory (K-major)
//       mask                 only on the ragged last tile and the causal diagonal tile
//       online softmax       in registers: running max m, running sum l, exp2 with
//                            log2(e)/sqrt(d) folded into one FMA, O rescaled by 2^(m_old-m_new)
//       P (bf16)             stays in registers: the wgmma fp32 accumulator layout of S is
//                            the register-A fragment layout of the next wgmma
//       O += P V             wgmma m64n{d}k16, A from registers, V from shared memory
//                            (MN-major, the transposed-B descriptor of matmul v7)
//     then O / l goes straight from registers to global memory, and L = (m + log2 l) ln 2.
//   * setmaxnreg moves registers from the producer (24) to the consumers (240);
//   * ping-pong: the two consumers take turns at the tensor cores (named barriers 1 and 2: a
//     consumer issues its GEMMs holding the turn and hands it over right after the issue), so
//     one warpgroup's softmax runs while the other's wgmma's do (FA3's warp scheduler barrier).
//     A turn issues S_j and P_{j-1} V_{j-1} together: two GEMMs of tensor work to hide the other
//     warpgroup's softmax behind;
//   * intra-warpgroup overlap (FA3): the softmax of tile j runs while the same warpgroup's
//     P_{j-1} V_{j-1} is still on the tensor cores (wait<1> for S_j alone; P_j into a second
//     register array; o rescaled after wait<0>).
//
// H100, bf16, d = 128, S 2048-16384 (lectures/results/a07c/): 0.95-1.08x SDPA, 0.96-1.07x in a
// second round (one CTA per tile, before persistence and the two overlaps: 0.88-0.98x). Causal
// and S = 2048 are at 1.00-1.08x; non-causal S >= 4096 is at 0.95-1.07x (below 1.0x at S = 8192 or
// 16384 in each round). Nsight Compute at S = 4096 non-causal: both grids are 132 persistent
// CTAs; the tensor (shared) pipe is 69 % busy here, 73 % in SDPA's kernel (61 % before). Left to
// try: BN = 176 (FA3's tile at d = 128: more GEMM per softmax and per barrier round), the
// epilogue through shared memory + a TMA store; at d = 64, 3 consumer warpgroups. (A 3-deep K/V ring at d = 128 measured the same as this 2-deep one.)
// Register budget: S, O and both P arrays are 192 registers a thread at the overlap. ptxas gives
// the consumers the 240 of setmaxnreg only if no trap is reachable from their code: a watchdog
// (__trap) in their barrier waits had it spill P and serialise every wgmma (C7512) at 168.
// So the consumers spin without one and the producer, which has it, waits at its end for their
// last release: a consumer stuck anywhere still ends in a trap.
//
// Build and check without a GPU (what common.cuda_ext.compile_check runs):
//   nvcc -arch=sm_90a -std=c++17 --expt-relaxed-constexpr -Icommon -c assignments/a07_flash_attention/flash_fwd_hopper.cu -o /dev/null
// the kernel itself, as load_op builds it, with the register/spill report (must show no C7510
// "wgmma serialized" line and no spills; tests/test_a07c_flash_hopper.py checks both):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -DA07C_SM90A -std=c++17 -O3 --expt-relaxed-constexpr -Icommon -Xptxas -v \
//        -c assignments/a07_flash_attention/flash_fwd_hopper.cu -o /dev/null
// (168 registers at launch, 0 spills, for d = 64/128, causal or not; the comparison builds:
// -DA07C_NO_PINGPONG without the schedule, -DA07C_NO_OVERLAP without the intra-warpgroup overlap)
// Run on an H100 (builds through common.cuda_ext.load_op, then tests, memcheck and benchmark):
//   bash run_hopper.sh, in this stage's folder of solutions/
//   o, lse = flash_attention_hopper(q, k, v, causal=True)   # assignments.a07_flash_attention.flash_hopper
#include <cuda.h>  // CUtensorMap and its enums (types only: the driver call is looked up at run time)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>

// The Hopper PTX building blocks (mbarriers, TMA, wgmma fences, setmaxnreg, tensor maps), given
// and shared with stage 6's v7: common/hopper.cuh. wgmma exists only in the sm_90a target; other
// targets get a stub kernel. -DA07C_DEBUG_HANG: the debug build (the watchdog prints the barrier).
#ifdef A07C_DEBUG_HANG
#define HOPPER_DEBUG_HANG
#endif
#ifdef A07C_HANG_NS
#error "the mbarrier watchdog's limit is HOPPER_HANG_NS (common/hopper.cuh)"
#endif
#include "hopper.cuh"
#define A07C_HAS_WGMMA HOPPER_HAS_WGMMA

namespace a07c {
using namespace hopper;

constexpr int BM = 128;                       // query rows per CTA (64 per consumer warpgroup)
constexpr int BN = 128;                       // keys per tile
constexpr int CONSUMERS = 2;                  // math warpgroups
constexpr int THREADS = 128 * (1 + CONSUMERS);
constexpr int PANEL = 64;                     // columns per TMA box: 64 bf16 = one 128-byte swizzled row
constexpr int PANEL_ROW_BYTES = PANEL * 2;    // 128

template <int D>
struct Cfg {
    static_assert(D == 64 || D == 128, "head dim 64 or 128");
    static constexpr int PANELS = D / PANEL;              // 1 or 2 boxes per tile
    static constexpr int STAGES = D == 64 ? 4 : 2;        // K/V ring depth (d=128: 2 x 64 KB)
    static constexpr int Q_PANEL_BYTES = BM * PANEL_ROW_BYTES;   // 16 KB: [128 rows][64 cols]
    static constexpr int KV_PANEL_BYTES = BN * PANEL_ROW_BYTES;  // 16 KB
    static constexpr int Q_BYTES = PANELS * Q_PANEL_BYTES;
    static constexpr int KV_BYTES = PANELS * KV_PANEL_BYTES;     // one K (or V) tile
    static constexpr int SMEM_BYTES = Q_BYTES + 2 * STAGES * KV_BYTES + 1024;  // + slack to align to 1024
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");
};

// ------------------------------------------------------------------ PTX wrappers (given)
// The building blocks are in common/hopper.cuh (shared with matmul v7); here what only this
// kernel uses: the warp-wide wait, the register-A wgmma and an operand fence.
// Consumers wait with all 32 lanes, then reconverge the warp: the wgmma's after the wait are
// .sync.aligned (every lane of every warp of the warpgroup, converged). Never from one lane.
// Without the watchdog: a trap anywhere in the consumers' code keeps ptxas from giving them the
// registers setmaxnreg raised (d = 128 spilled P and serialised every wgmma). A consumer stuck
// here still ends in a trap: the producer's last wait (the consumers' release of the last tile)
// has the watchdog. The debug build (-DA07C_DEBUG_HANG) times these waits too.
__device__ __forceinline__ void mbar_wait_warp(uint32_t bar, uint32_t parity) {
#ifdef A07C_DEBUG_HANG
    mbar_wait(bar, parity);
#else
    while (!mbar_try_wait(bar, parity)) {
    }
#endif
    __syncwarp();
}
// The shared-memory plan, from the 1024-byte aligned base: Q | K ring | V ring, each tile as
// PANELS boxes of [rows][64 columns] (16 KB each) side by side; and the wgmma descriptors of
// each k16 step. The kernel uses these, and so does the CPU check of the plan (tests/a07c/
// host_check.cu + layout_emu.py: TMA boxes, 128-byte swizzle and descriptors
// emulated byte by byte, expect-tx counts against the tensor maps' boxes).
template <int D>
struct Plan {
    using C = Cfg<D>;
    // TMA destinations: box p (columns 64p..64p+63) of the Q tile, of K / V tile in slot s.
    static __host__ __device__ constexpr uint32_t q_panel(uint32_t base, int p) { return base + p * C::Q_PANEL_BYTES; }
    static __host__ __device__ constexpr uint32_t k_panel(uint32_t base, int s, int p) {
        return base + C::Q_BYTES + s * C::KV_BYTES + p * C::KV_PANEL_BYTES;
    }
    static __host__ __device__ constexpr uint32_t v_panel(uint32_t base, int s, int p) {
        return base + C::Q_BYTES + (C::STAGES + s) * C::KV_BYTES + p * C::KV_PANEL_BYTES;
    }
    // S = Q K^T, k-th 16-column step of d, consumer warpgroup c (rows 64c..64c+63 of the Q
    // tile). Both K-major, 128-byte rows: the step starts 32 bytes into the row (the hardware
    // applies the swizzle); SBO = 8 rows * 128 B; LBO unused for swizzled K-major (1).
    static __host__ __device__ constexpr uint64_t desc_q(uint32_t base, int c, int k) {
        return smem_desc(q_panel(base, k / 4) + c * 64 * PANEL_ROW_BYTES + (k % 4) * 32, 16, 1024);
    }
    static __host__ __device__ constexpr uint64_t desc_k(uint32_t base, int s, int k) {
        return smem_desc(k_panel(base, s, k / 4) + (k % 4) * 32, 16, 1024);
    }
    // O += P V, kk-th 16-key step: V [128 keys][d] row-major is the MN-major (transposed) B.
    // LBO = from one 64-column panel to the next along d, SBO = from 8 key rows to the next 8.
    static __host__ __device__ constexpr uint64_t desc_v(uint32_t base, int s, int kk) {
        return smem_desc(v_panel(base, s, 0) + kk * 16 * PANEL_ROW_BYTES, C::KV_PANEL_BYTES, 1024);
    }
};
// 2^x in one MUFU instruction (ex2.approx(-inf) = +0, which the masking relies on).
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);   // .x (low half) = lo: the lower column
    return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ void store2(__nv_bfloat16* p, float x, float y) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
// Keep the compiler from moving reads/writes of a wgmma operand register across the
// (asynchronous) wgmma and its wait: an empty asm that "modifies" the register.
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#if A07C_HAS_WGMMA
// Named barriers 1 and 2 (0 is __syncthreads) between the two consumer warpgroups (256 threads):
// the ping-pong schedule's turn token. bar.sync waits for the other warpgroup's bar.arrive.
__device__ __forceinline__ void named_bar_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
#ifdef A07C_NO_PINGPONG
constexpr bool PINGPONG = false;   // the build without the schedule (COURSE_CUDA_DEFINES=A07C_NO_PINGPONG)
#else
constexpr bool PINGPONG = true;
#endif
#ifdef A07C_NO_OVERLAP
constexpr bool OVERLAP = false;    // the build without it (COURSE_CUDA_DEFINES=A07C_NO_OVERLAP)
#else
constexpr bool OVERLAP = true;     // softmax of tile j under the same warpgroup's P_{j-1} V_{j-1}
#endif


// Immediates after the operands: scale-d, scale-a, scale-b, [tnsp-a,] tnsp-b. S = Q K^T has
// both operands K-major (tnsp 0, 0); O += P V reads V MN-major (tnsp-b = 1), as matmul v7's B.
// d[64] += A(desc_a: smem, K-major) * B(desc_b: smem, K-major): S = Q K^T, one k16 step.
__device__ __forceinline__ void wgmma_ss_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, 1, 1, 1, 0, 0;\n"
        "}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b));
}

// d[32] += A(a: registers, 4 x bf16x2) * B(desc_b: smem, MN-major): O += P V, one k16 step.
__device__ __forceinline__ void wgmma_rs_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        "}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// d[64] += A(a: registers, 4 x bf16x2) * B(desc_b: smem, MN-major): O += P V, one k16 step.
__device__ __forceinline__ void wgmma_rs_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        "}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

template <int D> struct PV;
template <> struct PV<64> {
    static __device__ __forceinline__ void run(float (&d)[32], const uint32_t (&a)[4], uint64_t b) { wgmma_rs_m64n64k16(d, a, b); }
};
template <> struct PV<128> {
    static __device__ __forceinline__ void run(float (&d)[64], const uint32_t (&a)[4], uint64_t b) { wgmma_rs_m64n128k16(d, a, b); }
};
#endif  // A07C_HAS_WGMMA

// ------------------------------------------------------------------------------ kernel
// Grid: min(#SMs, ceil(S / BM) * B*H), persistent. Block: 384 threads = producer warpgroup + 2
// consumer warpgroups. tile_counter: an int that is 0 at launch (the launch leaves it 0 again).
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
attention_fwd_hopper(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                 const __grid_constant__ CUtensorMap map_v, __nv_bfloat16* __restrict__ O, float* __restrict__ L,
                 int S, int BH, float scale_log2, int* __restrict__ tile_counter) {
#if A07C_HAS_WGMMA
    using C = Cfg<D>;
    using P = Plan<D>;
    constexpr int STAGES = C::STAGES;
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t q_full, q_empty, k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
    __shared__ int tile_slot;   // the tile the producer fetched (-1: none left), published with q_full
    // 128-byte swizzled tiles must start on a 1024-byte boundary. Layout: Q | K ring | V ring,
    // each tile as PANELS boxes of [rows][64 columns] (16 KB each), side by side.
    const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;   // P::q_panel, k_panel, ... from here

    // Persistent: one CTA per SM walks over work tiles (a 128-row query block of one b*h), so that
    // the next tile's Q and K/V loads overlap this tile's last GEMMs and epilogue. Tile t: head
    // bh = t / n_mb, query block t % n_mb, the longest first when causal (later blocks see more
    // keys). Tiles 0 .. gridDim.x-1 go to CTA blockIdx.x; later ones to whichever CTA's producer
    // asks first (atomicAdd on tile_counter): causal tiles differ in length, and a fixed
    // round-robin left some SMs with twice the work of others. Heads-major order keeps the CTAs
    // running at one time on a few heads, whose K and V stay in L2.
    const int n_mb = (S + BM - 1) / BM;
    const int total = n_mb * BH;
    auto tile_rows = [&](int tile, int& bh, int& m0, int& n_tiles) {
        bh = tile / n_mb;
        const int i = tile % n_mb;
        m0 = (CAUSAL ? n_mb - 1 - i : i) * BM;
        const int kv_end = CAUSAL ? min(S, m0 + BM) : S;   // keys this query block can see: [0, kv_end)
        n_tiles = (kv_end + BN - 1) / BN;
    };

    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        mbar_init(smem_u32(&q_full), 1);
        mbar_init(smem_u32(&q_empty), CONSUMERS * 128);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(smem_u32(&k_full[s]), 1);                  // the producer's arrive + bytes
            mbar_init(smem_u32(&v_full[s]), 1);
            mbar_init(smem_u32(&k_empty[s]), CONSUMERS * 128);   // every consumer thread
            mbar_init(smem_u32(&v_empty[s]), CONSUMERS * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // the inits, seen by TMA (async proxy)
    }
    __syncthreads();

    // TODO(a07 7c): the producer and consumer loops and the epilogue. Outline:
    //  * producer (wg == 0): setmaxnreg_dec<24>(); thread t == 0 alone walks the tiles: the first is
    //    blockIdx.x, the next gridDim.x + atomicAdd(tile_counter, 1) (the fetch that returns
    //    total - 1 is the launch's last: it resets the counter to 0 for the next launch). Per tile
    //    i (counted from 0): wait q_empty for parity (i & 1) ^ 1 (the consumers' last S of the tile
    //    before), write tile_slot (-1 once tile >= total: then a plain mbar_arrive on q_full, and
    //    stop), expect Q_BYTES on q_full and TMA the Q boxes (x = 64p, y = m0, z = bh) into
    //    P::q_panel(base, p); then for each key tile j: ring index g (counting on across tiles),
    //    slot s = g % STAGES, phase = (g / STAGES) & 1; wait k_empty[s] for parity phase ^ 1,
    //    expect KV_BYTES on k_full[s], TMA the K boxes (x = 64p, y = j*BN, z = bh) into
    //    P::k_panel(base, s, p); the same for V (v_empty[s], v_full[s], P::v_panel). At the end,
    //    wait for the last V slot's release (the watchdog the consumers' waits do not have).
    //  * consumers (wg 1, 2): setmaxnreg_inc<240>(); per tile: wait q_full (parity i & 1), read
    //    tile_slot (stop at -1), tile_rows(); c = wg - 1 owns query rows m0 + 64c ..; thread
    //    (warp w, lane l) holds accumulator i at row 16w + l/4 + 8*((i/2)%2), column
    //    8*(i/4) + 2*(l%4) + i%2 (matmul v7's epilogue). Tile j's two GEMMs:
    //      S_j = Q K_j^T: S = 0 (then fence_operands(S)); wait k_full (consumers wait with
    //      mbar_wait_warp); for each 16-column step k of d: wgmma_ss_m64n128k16(S,
    //      P::desc_q(base, c, k), P::desc_k(base, s, k)).
    //      O += P_j V_j: for each 16-key step kk: PV<D>::run(o, a[kk], P::desc_v(base, s, kk)).
    //    Softmax of tile j (between them): mask (-inf) columns >= S and, causal, columns > row;
    //    online softmax in the exp2 domain (row max over the 4 lanes of a row: __shfl_xor_sync
    //    1 and 2), o rescaled; P to bf16: a[kk][r] = pack_bf16(S[8kk + 2r], S[8kk + 2r + 1]).
    //    Issue order, one wgmma_fence / commit / wait<0> per step: S_0; softmax_0; then for
    //    j = 1 .. n-1: S_j and P_{j-1} V_{j-1} together, wait, arrive on k_empty (slot of j)
    //    and v_empty (slot of j-1), softmax_j; last P_{n-1} V_{n-1}. Once S_{n-1} is done, arrive
    //    on q_empty (the producer may load the next tile's Q). Fence (fence_operands) the
    //    register operands (S, o, a) before wgmma_fence and after the wait.
    //  * epilogue: O = o / l (l summed over the 4 lanes of a row), rows < S only, and
    //    L = (m + log2 l) * ln 2 from lane l % 4 == 0.
    //  * once that passes: the ping-pong schedule (if PINGPONG): named_bar_sync(1 + c) before
    //    each step's wgmma_fence, named_bar_arrive(2 - c) right after its commit; consumer 1
    //    arrives on barrier 1 once before its first tile (consumer 0 goes first), consumer 0
    //    syncs on barrier 1 once after its last (the last arrive is matched). Then OVERLAP:
    //    S_j and P_{j-1} V_{j-1} as two commit groups, wait<1> for S_j, the softmax of tile j
    //    (into a second P array) while P_{j-1} V_{j-1} runs, then wait<0> and the rescale.
#else
    __trap();  // built without sm_90a: launch_attention_fwd_hopper refuses before we get here
#endif
}

// ------------------------------------------------------------------ host side (given)
// A contiguous bf16 [BH, S, D] tensor seen in boxes of [box_rows, 64] elements of one (b, h),
// 128-byte swizzled. Dim 1 (S) bounds the box: rows >= S are zero-filled, never the next head's.
inline bool make_map(CUtensorMap* map, const void* ptr, int BH, int S, int D, int box_rows) {
    EncodeTiled encode = encode_tiled();
    if (!encode) return false;
    const cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)S, (cuuint64_t)BH};   // innermost first
    const cuuint64_t strides[2] = {(cuuint64_t)D * 2, (cuuint64_t)S * D * 2};    // bytes, dims 1..
    const cuuint32_t box[3] = {(cuuint32_t)PANEL, (cuuint32_t)box_rows, 1};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The persistent kernel's tile counters (zero when the module loads; each launch leaves its
// counter at zero again). Launches take them in turn, so that launches running at the same time
// on different streams (up to COUNTERS of them) never share one.
constexpr int COUNTERS = 64;
__device__ int tile_counters[COUNTERS];
inline int next_counter() {
    static std::atomic<unsigned> n{0};
    return (int)(n.fetch_add(1, std::memory_order_relaxed) % COUNTERS);
}

template <int D, bool CAUSAL>
cudaError_t launch(const void* q, const void* k, const void* v, void* o, float* lse, int BH, int S, int sms,
                   cudaStream_t stream) {
    CUtensorMap map_q, map_k, map_v;
    if (!make_map(&map_q, q, BH, S, D, BM) || !make_map(&map_k, k, BH, S, D, BN) || !make_map(&map_v, v, BH, S, D, BN))
        return cudaErrorInvalidValue;
    auto kernel = attention_fwd_hopper<D, CAUSAL>;  // (no "flash_fwd" in the name: that is SDPA's kernel to the checks)
    static bool configured = false;   // one per instantiation
    if (!configured) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg<D>::SMEM_BYTES);
        if (e != cudaSuccess) return e;
        configured = true;
    }
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)D);
    const long long tiles = (long long)((S + BM - 1) / BM) * BH;
    if (tiles > INT_MAX / 2) return cudaErrorInvalidValue;
    const int grid = (int)std::min<long long>(tiles, std::max(sms, 1));   // persistent: one CTA per SM
    int* counter = nullptr;
    cudaError_t e = cudaGetSymbolAddress(reinterpret_cast<void**>(&counter), tile_counters);
    if (e != cudaSuccess) return e;
    counter += next_counter();
    kernel<<<grid, THREADS, Cfg<D>::SMEM_BYTES, stream>>>(map_q, map_k, map_v, static_cast<__nv_bfloat16*>(o), lse,
                                                          S, BH, scale_log2, counter);
    return cudaGetLastError();
}

}  // namespace a07c

// q, k, v, o: contiguous bf16 [BH, S, D]; lse: contiguous fp32 [BH, S]. D = 64 or 128.
// Returns cudaErrorNotSupported off Hopper (sm_90) or when built without sm_90a
// (-DA07C_SM90A, which flash_hopper.py passes with the sm_90a target), cudaErrorInvalidValue
// for what the kernel cannot take (D, sizes, 16-byte alignment, more than 65535 heads).
cudaError_t launch_attention_fwd_hopper(const void* q, const void* k, const void* v, void* o, float* lse, int BH, int S,
                                    int D, bool causal, cudaStream_t stream) {
    using namespace a07c;
    if (BH == 0 || S == 0) return cudaSuccess;
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (major != 9 || minor != 0) return cudaErrorNotSupported;
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
#ifndef A07C_SM90A
    return cudaErrorNotSupported;  // the kernel was compiled without the sm_90a target
#endif
    if (BH < 0 || S < 0 || BH > 65535 ||
        ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v) |
          reinterpret_cast<uintptr_t>(o)) & 15))
        return cudaErrorInvalidValue;
    if (D == 64) return causal ? launch<64, true>(q, k, v, o, lse, BH, S, sms, stream)
                      : launch<64, false>(q, k, v, o, lse, BH, S, sms, stream);
    if (D == 128) return causal ? launch<128, true>(q, k, v, o, lse, BH, S, sms, stream)
                      : launch<128, false>(q, k, v, o, lse, BH, S, sms, stream);
    return cudaErrorInvalidValue;
}
