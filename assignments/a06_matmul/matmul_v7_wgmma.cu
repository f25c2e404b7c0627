// Assignment 6, version 7: Hopper tensor cores the way cuBLAS uses them (you write the TODO body).
//   C[M,N] = A[M,K] @ B[K,N], fp16/bf16 in, fp32 accumulate, all row-major.
//
// Idea: v5/v6 spend most of their issue slots feeding the tensor cores: every warp copies
// tiles (cp.async), loads fragments (ldmatrix) and issues small mma.sync, then the whole
// block waits at a barrier every K slice. Hopper moves all of that into hardware:
//   * TMA (the tensor memory accelerator, `cp.async.bulk.tensor`): ONE thread asks for a
//     whole [rows x 64] tile; the copy engine computes the addresses, zero-fills what lies
//     outside the matrix, writes the tile already 128-byte swizzled, and counts the bytes
//     in on an mbarrier (a shared-memory barrier with a transaction count).
//   * wgmma (`wgmma.mma_async`): a warpgroup (4 warps, 128 threads) multiplies a 64xBNx16
//     block straight out of shared memory (no ldmatrix), asynchronously; the 64xBN fp32
//     accumulator lives in the warpgroup's registers (BN/2 per thread).
//   * warp specialisation: warpgroup 0 is the producer (one thread issues TMA copies
//     STAGES slices ahead), the other warpgroups are consumers (64 rows of the BM x BN tile
//     each). They talk only through two mbarriers per stage: `full` (the slice has landed)
//     and `empty` (every consumer is done with it). No __syncthreads in the main loop.
//     `setmaxnreg` moves registers from the producer (40) to the consumers (232).
//   * persistent blocks: one block per SM (never more than there are tiles) walks the tiles
//     blockIdx.x, blockIdx.x + gridDim.x, ... Its producer runs on into the next tile while
//     the consumers store this one, so a tile's first slices are already in shared memory
//     when its math starts; launching a block per tile pays that latency every time.
//   * the tile shape is picked per problem (pick_tile, host side): 128x256 where there are
//     enough tiles to fill the SMs, smaller tiles (128x128, 64x128, 64x64) where a GEMM has
//     too few rows or columns for that (GPT-2 at 512 tokens: 12 tiles of 128x256 for 132 SMs).
// Expect (H100, bf16): 4096^3 about 89% of cuBLAS; lectures/results/a06_matmul_real_shapes.md has
// the GPT-2 shapes. cuBLAS adds clusters with TMA multicast, an epilogue through shared memory
// and TMA stores, and two consumer warpgroups that take turns on separate tiles.
//
// Limits (TMA's): row strides must be multiples of 16 bytes, so K % 8 == 0 and N % 8 == 0,
// and the pointers 16-byte aligned; M is free. The Python wrapper says so for other shapes
// (use v6). Needs an sm_90 GPU and the sm_90a build target (matmul_cuda.py passes it).
//
//     c = matmul(a, b, version=7)                 # from assignments.a06_matmul.matmul_cuda
//     c = matmul(a, b, version=7, tile=(64, 128))  # one tile shape instead of pick_tile's
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// The Hopper PTX building blocks (mbarriers, TMA, wgmma fences, setmaxnreg, tensor maps), given
// and shared with stage 7c: common/hopper.cuh. wgmma exists only in the sm_90a target; other
// targets get a stub kernel.
#include "hopper.cuh"
#define A06_HAS_WGMMA HOPPER_HAS_WGMMA
#ifdef A06_HANG_NS
#error "the mbarrier watchdog's limit is HOPPER_HANG_NS (common/hopper.cuh)"
#endif

namespace a06v7 {
using namespace hopper;

constexpr int BK = 64;       // K slice: BK * 2 bytes = one 128-byte row, the swizzle's width
constexpr int PANEL = 64;    // columns of B per TMA box (128 bytes)
constexpr int GROUP_M = 8;   // grouped tile order, as in v5

// A tile shape: a BM x BN block of C, STAGES K slices in flight. One consumer warpgroup per
// 64 rows; the shared memory of a stage is A's [BM][64] box and B's BN/64 [64][64] panels.
template <int BM_, int BN_, int STAGES_>
struct Tile {
    static constexpr int BM = BM_, BN = BN_, STAGES = STAGES_;
    static constexpr int CONSUMERS = BM / 64;             // math warpgroups, 64 rows of the tile each
    static constexpr int THREADS = 128 * (1 + CONSUMERS); // + the producer warpgroup
    static constexpr int ACC = BN / 2;                    // fp32 accumulators per consumer thread
    static constexpr int A_BYTES = BM * BK * 2;           // [BM rows][64 k], K-major
    static constexpr int B_PANEL_BYTES = BK * PANEL * 2;  // 8 KB: [64 k][64 n], N-major
    static constexpr int B_BYTES = BK * BN * 2;           // BN/64 panels side by side
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024;  // + slack to align to 1024 bytes
    static long tiles(int M, int N) { return (long)((M + BM - 1) / BM) * ((N + BN - 1) / BN); }  // host side
    static_assert(BM % 64 == 0 && BN % PANEL == 0 && SMEM_BYTES <= 227 * 1024, "tile does not fit");
};
// The shapes pick_tile chooses from (all 192 KB of shared memory but the last).
using Tile128x256 = Tile<128, 256, 4>;   // 48 KB a stage
using Tile128x128 = Tile<128, 128, 6>;   // 32 KB
using Tile64x128 = Tile<64, 128, 8>;     // 24 KB
using Tile64x64 = Tile<64, 64, 8>;       // 16 KB

// ------------------------------------------------------------------ wgmma instructions (given)
// (the rest of the PTX wrappers: common/hopper.cuh)
#if A06_HAS_WGMMA

// One m64n64k16 wgmma (16-bit inputs of type TY, fp32 accumulate): d += A(desc_a) * B(desc_b),
// 32 accumulators per thread. A is K-major (row-major [M, K] tile); B is MN-major
// (row-major [K, N] tile): the immediates are scale-d, scale-a, scale-b, tnsp-a = 0, tnsp-b = 1.
#define A06_WGMMA_M64N64K16(TY) \
    asm volatile( \
        "{\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
        "{" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
        "}, %32, %33, 1, 1, 1, 0, 1;\n" \
        "}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
        : "l"(desc_a), "l"(desc_b))

// One m64n128k16 wgmma (16-bit inputs of type TY, fp32 accumulate): d += A(desc_a) * B(desc_b),
// 64 accumulators per thread. A is K-major (row-major [M, K] tile); B is MN-major
// (row-major [K, N] tile): the immediates are scale-d, scale-a, scale-b, tnsp-a = 0, tnsp-b = 1.
#define A06_WGMMA_M64N128K16(TY) \
    asm volatile( \
        "{\n" \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
        "{" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
        "%59, %60, %61, %62, %63" \
        "}, %64, %65, 1, 1, 1, 0, 1;\n" \
        "}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
        : "l"(desc_a), "l"(desc_b))

// One m64n256k16 wgmma (16-bit inputs of type TY, fp32 accumulate): d += A(desc_a) * B(desc_b),
// 128 accumulators per thread. A is K-major (row-major [M, K] tile); B is MN-major
// (row-major [K, N] tile): the immediates are scale-d, scale-a, scale-b, tnsp-a = 0, tnsp-b = 1.
#define A06_WGMMA_M64N256K16(TY) \
    asm volatile( \
        "{\n" \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " \
        "{" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
        "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, " \
        "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, " \
        "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, " \
        "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
        "}, %128, %129, 1, 1, 1, 0, 1;\n" \
        "}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
        : "l"(desc_a), "l"(desc_b))

// Wgmma<T, BN>::run(d, desc_a, desc_b): one m64nBNk16 step into d[BN / 2].
template <typename T, int BN> struct Wgmma;
#define A06_WGMMA_TYPE(T, TY, N)                                                                      \
    template <> struct Wgmma<T, N> {                                                                  \
        static __device__ __forceinline__ void run(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) { \
            A06_WGMMA_M64N##N##K16(TY);                                                               \
        }                                                                                             \
    };
A06_WGMMA_TYPE(__nv_bfloat16, "bf16", 64)
A06_WGMMA_TYPE(__nv_bfloat16, "bf16", 128)
A06_WGMMA_TYPE(__nv_bfloat16, "bf16", 256)
A06_WGMMA_TYPE(__half, "f16", 64)
A06_WGMMA_TYPE(__half, "f16", 128)
A06_WGMMA_TYPE(__half, "f16", 256)
#endif  // A06_HAS_WGMMA

__device__ __forceinline__ void store2(__nv_bfloat16* p, float x, float y) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void store2(__half* p, float x, float y) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}

// Tile number -> its top-left corner, in grouped order: GROUP_M tile-rows are swept column
// by column (as in v5), so the tiles the SMs work on at once share rows of A and columns of B.
template <class C>
__device__ __forceinline__ void tile_origin(int tile, int grid_m, int grid_n, int& m0, int& n0) {
    const int per_group = GROUP_M * grid_n;
    const int first_m = (tile / per_group) * GROUP_M;
    const int group_m = min(grid_m - first_m, GROUP_M);
    m0 = (first_m + (tile % per_group) % group_m) * C::BM;
    n0 = ((tile % per_group) / group_m) * C::BN;
}

// ------------------------------------------------------------------------------ kernel
// Grid: min(tiles, SMs) persistent blocks of C::THREADS threads (1 + C::CONSUMERS warpgroups).
template <typename T, class C>
__global__ void __launch_bounds__(C::THREADS, 1)
matmul_v7_wgmma(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                T* __restrict__ Cout, int M, int N, int K) {
#if A06_HAS_WGMMA
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t full[C::STAGES], empty[C::STAGES];
    // 128-byte swizzled tiles must start on a 1024-byte boundary.
    const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
    auto a_tile = [&](int s) { return base + s * C::STAGE_BYTES; };
    auto b_tile = [&](int s) { return base + s * C::STAGE_BYTES + C::A_BYTES; };

    const int grid_m = (M + C::BM - 1) / C::BM, grid_n = (N + C::BN - 1) / C::BN;
    const int tiles = grid_m * grid_n;
    const int KT = (K + BK - 1) / BK;
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < C::STAGES; ++s) {
            mbar_init(smem_u32(&full[s]), 1);                       // the producer's arrive + bytes
            mbar_init(smem_u32(&empty[s]), C::CONSUMERS * 128);     // every consumer thread
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    // TODO(a06 v7): the producer and consumer loops and the epilogue. Every warpgroup walks the
    //   same tiles: for (tile = blockIdx.x; tile < tiles; tile += gridDim.x), corner from
    //   tile_origin<C>(tile, grid_m, grid_n, m0, n0). Count the K slices across tiles (it = 0, 1,
    //   2, ... never reset): slice `it` uses slot s = it % C::STAGES, and its barrier phase
    //   is (it / C::STAGES) & 1, so the ring runs on from one tile into the next.
    //  * producer (wg == 0): setmaxnreg_dec<40>(); then thread t == 0 alone, for each tile and
    //    each K slice kt: wait empty[s] for parity phase ^ 1 (the first round passes at once);
    //    mbar_arrive_expect_tx(full[s], C::STAGE_BYTES); one TMA box of A at (x = kt*BK, y = m0)
    //    into a_tile(s) and C::BN/PANEL boxes of B at (x = n0 + p*PANEL, y = kt*BK) into
    //    b_tile(s) + p*C::B_PANEL_BYTES.
    //  * consumers (wg >= 1): setmaxnreg_inc<232>(); c = wg - 1 owns rows [64c, 64c+64). Per
    //    tile: float acc[C::ACC] = 0. For each kt: wait full[s] for parity phase; wgmma_fence();
    //    for k in 0..BK/16-1: A descriptor smem_desc(a_tile(s) + c*64*BK*2 + k*32, 16, 1024),
    //    B descriptor smem_desc(b_tile(s) + k*16*PANEL*2, C::B_PANEL_BYTES, 1024),
    //    Wgmma<T, C::BN>::run(acc, da, db); then wgmma_commit(); wgmma_wait<1>() (this slice's
    //    products may still run: the previous slice's are done), and every consumer thread
    //    arrives on the previous slice's empty barrier. After the last slice: wgmma_wait<0>(),
    //    arrive on the last slot's empty barrier (its count is C::CONSUMERS * 128).
    //  * epilogue (per tile): thread t (warp w = t/32, lane l = t%32) holds acc[i] at row
    //    16w + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + i%2 of its 64xBN block;
    //    store pairs with store2() where row < M and column < N (N % 8 == 0 here).
#else
    __trap();  // built without sm_90a: launch_wgmma refuses before we get here
#endif
}

// ------------------------------------------------------------------ host side (given)
// A 2-D row-major tensor [rows, cols] seen in boxes of [box_rows, 64] elements, 128-byte swizzled.
inline bool make_map(CUtensorMap* map, const void* ptr, CUtensorMapDataType dt, int rows, int cols, int box_rows) {
    EncodeTiled encode = encode_tiled();
    if (!encode) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};   // innermost first
    const cuuint64_t strides[1] = {(cuuint64_t)cols * 2};               // bytes, dims 1..
    const cuuint32_t box[2] = {(cuuint32_t)PANEL, (cuuint32_t)box_rows};
    const cuuint32_t elem_strides[2] = {1, 1};
    return encode(map, dt, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

inline int sm_count() {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    }
    return sms;
}

// The tile shape for an M x N output on `sms` SMs: the one whose busiest SM finishes first.
// Each of min(tiles, sms) blocks runs ceil(tiles / sms) tiles one after another, and a tile
// costs its area over a relative speed (a larger tile reuses each byte it loads more, and feeds
// the tensor cores longer wgmma's). Returns 0: 128x256, 1: 128x128, 2: 64x128, 3: 64x64.
template <class C>
inline double tile_cost(int M, int N, int sms, double speed) {
    return (double)((C::tiles(M, N) + sms - 1) / sms) * C::BM * C::BN / speed;
}
inline int pick_tile(int M, int N, int sms) {
    const double cost[4] = {tile_cost<Tile128x256>(M, N, sms, 1.0), tile_cost<Tile128x128>(M, N, sms, 0.9),
                            tile_cost<Tile64x128>(M, N, sms, 0.75), tile_cost<Tile64x64>(M, N, sms, 0.55)};
    int best = 0;
    for (int i = 1; i < 4; ++i)
        if (cost[i] < cost[best]) best = i;
    return best;
}

template <typename T, class C>
cudaError_t launch(const T* a, const T* b, T* c, int M, int N, int K, CUtensorMapDataType dt, cudaStream_t stream) {
    CUtensorMap map_a, map_b;
    if (!make_map(&map_a, a, dt, M, K, C::BM) || !make_map(&map_b, b, dt, K, N, BK)) return cudaErrorInvalidValue;
    auto kernel = matmul_v7_wgmma<T, C>;
    static bool configured = false;
    if (!configured) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES);
        if (e != cudaSuccess) return e;
        configured = true;
    }
    const long tiles = C::tiles(M, N);
    const int blocks = tiles < sm_count() ? (int)tiles : sm_count();
    kernel<<<blocks, C::THREADS, C::SMEM_BYTES, stream>>>(map_a, map_b, c, M, N, K);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_tile(int tile, const T* a, const T* b, T* c, int M, int N, int K, CUtensorMapDataType dt,
                        cudaStream_t stream) {
    switch (tile) {
        case 0: return launch<T, Tile128x256>(a, b, c, M, N, K, dt, stream);
        case 1: return launch<T, Tile128x128>(a, b, c, M, N, K, dt, stream);
        case 2: return launch<T, Tile64x128>(a, b, c, M, N, K, dt, stream);
        case 3: return launch<T, Tile64x64>(a, b, c, M, N, K, dt, stream);
    }
    return cudaErrorInvalidValue;
}

}  // namespace a06v7

// dtype: 1 = float16, 2 = bfloat16. tile: -1 = pick_tile's choice, 0..3 one of the tile shapes
// (128x256, 128x128, 64x128, 64x64). Returns cudaErrorNotSupported off Hopper (or when built
// without sm_90a) and cudaErrorInvalidValue for shapes TMA cannot describe or an unknown tile.
cudaError_t launch_matmul_v7(const void* a, const void* b, void* c, int M, int N, int K, int dtype, int tile,
                             cudaStream_t stream) {
    using namespace a06v7;
    if (M == 0 || N == 0) return cudaSuccess;
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (major != 9 || minor != 0) return cudaErrorNotSupported;
#ifndef A06_SM90A
    return cudaErrorNotSupported;  // the kernel was compiled without the sm_90a target
#endif
    if (K % 8 != 0 || N % 8 != 0 || K == 0 || tile < -1 || tile > 3 ||
        ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | reinterpret_cast<uintptr_t>(c)) & 15))
        return cudaErrorInvalidValue;
    if (tile < 0) tile = pick_tile(M, N, sm_count());
    if (dtype == 1)
        return launch_tile(tile, static_cast<const __half*>(a), static_cast<const __half*>(b), static_cast<__half*>(c),
                           M, N, K, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, stream);
    if (dtype == 2)
        return launch_tile(tile, static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b),
                           static_cast<__nv_bfloat16*>(c), M, N, K, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, stream);
    return cudaErrorInvalidValue;
}
