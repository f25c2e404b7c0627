// Assignment 6: tiled matrix multiplication, C[M,N] = A[M,K] @ B[K,N], all row-major.
//
// Six kernels in this file, each a step up from the one before (you write the TODO bodies). Versions 1-4
// are fp32 on the CUDA cores (FFMA); versions 5 and 6 are fp16/bf16 on the tensor cores
// with fp32 accumulation (one kernel template, two tile shapes). Version 7, Hopper's
// TMA + wgmma, is in matmul_v7_wgmma.cu. Versions 1-6 handle any M, N,
// K (sizes need not divide the tile): loads outside the matrix read zeros, stores
// outside the matrix are skipped.
//
// Build and call (from Python, on a GPU machine):
//     from assignments.a06_matmul.matmul_cuda import matmul
//     c = matmul(a, b, version=4)                 # builds once, about a minute
// Check without a GPU:
//     python -c "from common.cuda_ext import compile_check; compile_check(['assignments/a06_matmul/matmul_kernels.cu'])"
// Time every version against cuBLAS:
//     python -m common.course.bench a06
//
// The launcher at the bottom (launch_matmul) is plain C++: pointers, sizes, a stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace a06 {

__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }

// =====================================================================================
// Version 1: naive, one thread per output element.
//   Idea: thread (x, y) computes C[row, col] as a K-long dot product from global memory.
//   Here threadIdx.x walks down a column of C (x -> row), so the 32 threads of a warp
//   read 32 different rows of A (addresses K floats apart: 32 transactions per load)
//   and write 32 different rows of C.
//   Expect: a few hundred GFLOP/s; every operand comes from L2/DRAM, uncoalesced.
// =====================================================================================
__global__ void matmul_v1_naive(const float* __restrict__ A, const float* __restrict__ B,
                                float* __restrict__ C, int M, int N, int K) {
    // TODO(a06 v1): row = blockIdx.x * blockDim.x + threadIdx.x (x walks down a column of C),
    // col = blockIdx.y * blockDim.y + threadIdx.y. If (row, col) is inside C, accumulate
    // A[row, k] * B[k, col] over k in a float and store C[row, col]. Index with size_t.
}

// =====================================================================================
// Version 2: coalesced global access.
//   Idea: the same arithmetic, but threadIdx.x walks along a row of C (x -> col). Now a
//   warp reads one A element (a broadcast) and 32 consecutive B elements (one 128-byte
//   transaction), and writes 32 consecutive C elements.
//   Expect: several times faster than v1 from the memory system alone; still every FMA
//   needs two loads, so it is bound by L1/L2 bandwidth, far from the FMA rate.
// =====================================================================================
__global__ void matmul_v2_coalesced(const float* __restrict__ A, const float* __restrict__ B,
                                    float* __restrict__ C, int M, int N, int K) {
    // TODO(a06 v2): as v1, but col = blockIdx.x * blockDim.x + threadIdx.x and
    // row = blockIdx.y * blockDim.y + threadIdx.y, so a warp's 32 threads touch 32
    // consecutive columns (see launch_matmul for the grid).
}

// =====================================================================================
// Version 3: shared-memory tiling (the lecture's "Trick 5").
//   Idea: a 32x32 block of threads computes a 32x32 tile of C. It walks K in steps of 32:
//   each thread loads one element of A's tile and one of B's into shared memory, the
//   block synchronises, and every thread does 32 FMAs from shared memory. Each global
//   element is now read by the block once instead of 32 times.
//   Expect: about 2x over v2; now shared-memory loads (2 per FMA) are the limit.
// =====================================================================================
constexpr int V3_TILE = 32;

__global__ void matmul_v3_smem(const float* __restrict__ A, const float* __restrict__ B,
                               float* __restrict__ C, int M, int N, int K) {
    // TODO(a06 v3): __shared__ float As[V3_TILE][V3_TILE], Bs[V3_TILE][V3_TILE]; thread
    // (tx, ty) owns C[blockIdx.y*32 + ty, blockIdx.x*32 + tx]. For k0 = 0, 32, ...: load one
    // element of A's tile and one of B's (zero outside the matrices), __syncthreads(),
    // accumulate 32 products from shared memory, __syncthreads(). Store if inside C.
}

// =====================================================================================
// Version 4: register blocking (2-D thread tiles), vectorised loads, double buffering.
//   Idea: 256 threads compute a 128x128 tile of C; each thread owns an 8x8 block of C
//   in registers. Per k step a thread loads 8 values of A and 8 of B from shared memory
//   (four 16-byte loads) and does 64 FMAs: 16 FMAs per shared load instead of 0.5.
//   A's tile is stored transposed (As[k][m]) so both operands are read as float4.
//   Global loads are float4 (when N and K are multiples of 4), and the next K slice is
//   fetched into registers while the current one is multiplied (two shared buffers, one
//   __syncthreads per slice).
//   The 8x8 outputs are two 4x4 blocks 64 apart in each direction, so a warp's float4
//   reads of Bs are 16 consecutive 16-byte words (no bank conflicts); As rows are padded
//   by 4 floats so the transposed stores of the two half-warps land in different banks.
//   Expect: FMA-bound, roughly 60-80% of cuBLAS fp32 (TF32 off) at large sizes.
// =====================================================================================
constexpr int V4_BM = 128, V4_BN = 128, V4_BK = 8, V4_THREADS = 256;

template <bool VEC>  // VEC: N % 4 == 0, K % 4 == 0 and 16-byte aligned pointers
__global__ void __launch_bounds__(V4_THREADS, 2)  // <= 128 registers: two blocks per SM
matmul_v4_regblock(const float* __restrict__ A, const float* __restrict__ B,
                   float* __restrict__ C, int M, int N, int K) {
    // TODO(a06 v4): see the header comment above and the handout. Outline:
    //  * __shared__ __align__(16) float As[2][V4_BK][V4_BM + 4] (A transposed, padded),
    //    Bs[2][V4_BK][V4_BN]; thread tid: tx = tid % 16, ty = tid / 16, 8x8 accumulators.
    //  * each K slice of 8: one float4 of A (row tid/2, cols (tid%2)*4..+3) and one of B
    //    (row tid/32, cols (tid%32)*4..+3) per thread; zeros outside the matrices. When
    //    VEC is false use scalar loads with a bound check per element.
    //  * prefetch the next slice into registers, multiply the current one out of shared
    //    memory (rows ty*4..+3 and 64+ty*4..+3, cols tx*4..+3 and 64+tx*4..+3, float4
    //    reads), then store the prefetched slice into the other buffer; one __syncthreads.
    //  * store the 8x8 block (float4 when VEC), skipping rows >= M and columns >= N.
}

// =====================================================================================
// Versions 5 and 6: tensor cores (mma.sync m16n8k16, fp16/bf16 in, fp32 accumulate).
//   Idea: a block computes a BMxBN tile of C with 8 warps; each warp owns a WMxWN piece
//   of it as (WM/16)x(WN/8) mma tiles held in registers. K is walked in slices of 32:
//   * cp.async copies each slice from global to shared memory without passing through
//     registers, STAGES slices ahead (a multi-stage pipeline hides the DRAM latency);
//   * ldmatrix loads mma fragments from shared memory (x4: four 8x8 matrices per
//     instruction; .trans for B, which is stored k-major);
//   * shared tiles are XOR-swizzled at 16-byte granularity so the 8 rows an ldmatrix
//     phase reads sit in 8 different bank groups (no conflicts, no padding);
//   * tiles are visited in groups of 8 tile-rows (as in Triton's matmul) so blocks
//     running together share A and B slices in L2.
//   v5: 128x128 tile, K slices of 32, 4 stages (64 KB), warps 2x4 of 64x32 (64 fp32
//       accumulators per thread, 127 registers: two blocks per SM).
//   v6: 128x256 tile, K slices of 32, 4 stages (96 KB), warps 2x4 of 64x64 (128
//       accumulators per thread, ~236 registers: one block per SM): twice the mma work
//       per ldmatrix of A, half the B traffic per FLOP.
//   Expect: hundreds of TFLOP/s; mma.sync cannot reach Hopper's wgmma peak (cuBLAS uses
//   wgmma + TMA), so a well-fed mma.sync kernel lands around half to two thirds of it.
// =====================================================================================
// mma.sync m16n8k16 and cp.async exist from sm_80 (Ampere) on. Built for an older GPU (a T4 is sm_75)
// these helpers trap instead, so that versions 1-4 still build and run there; the Python wrapper
// refuses versions 5 and 6 on such a GPU before launching, naming it (common.gpu.why_not).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define A06_BEFORE_SM80 1
#else
#define A06_BEFORE_SM80 0
#endif
template <typename T> struct Mma;
template <> struct Mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if A06_BEFORE_SM80
        __trap();
#else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
    }
    static __device__ __forceinline__ __nv_bfloat16 from(float x) { return __float2bfloat16(x); }
    static __device__ __forceinline__ __nv_bfloat162 from2(float x, float y) { return __floats2bfloat162_rn(x, y); }
    using T2 = __nv_bfloat162;
};
template <> struct Mma<__half> {
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if A06_BEFORE_SM80
        __trap();
#else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
    }
    static __device__ __forceinline__ __half from(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ __half2 from2(float x, float y) { return __floats2half2_rn(x, y); }
    using T2 = __half2;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte global->shared copy; copies zeros when pred is false (src-size 0).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
#if A06_BEFORE_SM80
    __trap();
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(pred ? 16 : 0));
#endif
}
#if A06_BEFORE_SM80
__device__ __forceinline__ void cp_async_commit() { __trap(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { __trap(); }
#else
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#endif

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

constexpr int TC_WARPS_M = 2, TC_WARPS_N = 4, TC_THREADS = 256, TC_GROUP_M = 8;

// Swizzled element offset of 16-byte chunk c in row r of a shared tile with CH chunks a
// row. ldmatrix reads one chunk from each of 8 consecutive rows; XOR-ing the chunk index
// with the row's place in its group of 128-byte lines puts those 8 chunks in 8 different
// bank groups. 64-byte rows (CH = 4): two rows share a line, XOR with bits 1..2 of r;
// rows of 128 bytes or more: XOR with the low 3 bits of r.
template <int CH>
__device__ __forceinline__ int swz(int r, int c) {
    constexpr int rows_per_line = CH >= 8 ? 1 : 8 / CH;
    constexpr int mask = (CH >= 8 ? 8 : CH) - 1;
    return r * CH * 8 + ((c ^ ((r / rows_per_line) & mask)) << 3);
}

template <int BM, int BN, int BK, int STAGES>
constexpr int tc_smem_bytes() { return STAGES * (BM * BK + BK * BN) * 2; }

// ALIGNED: N % 8 == 0, K % 8 == 0 and 16-byte aligned pointers (cp.async of whole chunks).
template <typename T, int BM, int BN, int BK, int STAGES, bool ALIGNED>
__global__ void __launch_bounds__(TC_THREADS)
matmul_v5_mma(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K) {
    // TODO(a06 v5/v6): see the header comment above and the handout. Outline:
    //  * extern __shared__ tiles: STAGES x [BM][BK] of A, then STAGES x [BK][BN] of B,
    //    addressed through swz<BK / 8>(row, chunk) and swz<BN / 8>(row, chunk);
    //  * tile (pid_m, pid_n) from blockIdx.x in grouped order (TC_GROUP_M tile-rows);
    //  * 8 warps as TC_WARPS_M x TC_WARPS_N, each owning (BM/2)x(BN/4) of C as m16n8 tiles
    //    with float accumulators;
    //  * pipeline: issue STAGES-1 slices with cp_async16 (pred=false zero-fills outside
    //    the matrices; when ALIGNED is false use plain element loads instead), one
    //    cp_async_commit per slice; per slice: cp_async_wait<STAGES-2>, __syncthreads,
    //    issue slice kt+STAGES-1, then BK/16 k16 steps of ldmatrix_x4 (A),
    //    ldmatrix_x4_trans (B) and Mma<T>::run (load step ks+1's fragments before
    //    step ks's mma);
    //  * epilogue: accumulator (mt, nt) holds rows lane/4 and lane/4+8, columns
    //    2*(lane%4)+{0,1}; convert with Mma<T>::from / from2 and store inside C only.
}

template <typename T, int BM, int BN, int BK, int STAGES, bool ALIGNED>
cudaError_t launch_tc(const T* a, const T* b, T* c, int M, int N, int K, cudaStream_t stream) {
    constexpr int smem = tc_smem_bytes<BM, BN, BK, STAGES>();
    auto kernel = matmul_v5_mma<T, BM, BN, BK, STAGES, ALIGNED>;
    static bool configured = false;  // raise the dynamic shared-memory limit once
    if (!configured) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        configured = true;
    }
    const int blocks = cdiv(M, BM) * cdiv(N, BN);
    kernel<<<blocks, TC_THREADS, smem, stream>>>(a, b, c, M, N, K);
    return cudaGetLastError();
}

// Tile shapes of the two tensor-core versions: BM, BN, BK (K slice), STAGES.
#define A06_V5_TILE 128, 128, 32, 4
#define A06_V6_TILE 128, 256, 32, 4

template <typename T>
cudaError_t launch_tensor_core(const void* a, const void* b, void* c, int M, int N, int K, int version,
                               bool aligned, cudaStream_t stream) {
    auto A = static_cast<const T*>(a);
    auto B = static_cast<const T*>(b);
    auto C = static_cast<T*>(c);
    if (version == 5)
        return aligned ? launch_tc<T, A06_V5_TILE, true>(A, B, C, M, N, K, stream)
                       : launch_tc<T, A06_V5_TILE, false>(A, B, C, M, N, K, stream);
    return aligned ? launch_tc<T, A06_V6_TILE, true>(A, B, C, M, N, K, stream)
                   : launch_tc<T, A06_V6_TILE, false>(A, B, C, M, N, K, stream);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace a06

// Version 7 (Hopper: TMA + wgmma + warp specialisation) lives in matmul_v7_wgmma.cu.
cudaError_t launch_matmul_v7(const void* a, const void* b, void* c, int M, int N, int K, int dtype, int tile,
                             cudaStream_t stream);

// dtype: 0 = float32, 1 = float16, 2 = bfloat16. Versions 1-4 take float32, 5-7 take
// float16/bfloat16. v7_tile: version 7's tile shape (-1: its own pick; see matmul_v7_wgmma.cu).
// Returns cudaErrorInvalidValue for a bad (version, dtype) pair.
cudaError_t launch_matmul(const void* a, const void* b, void* c, int M, int N, int K, int dtype,
                          int version, int v7_tile, cudaStream_t stream) {
    using namespace a06;
    if (M == 0 || N == 0) return cudaSuccess;
    const bool ptrs16 = aligned16(a) && aligned16(b) && aligned16(c);
    if (version >= 1 && version <= 4) {
        if (dtype != 0) return cudaErrorInvalidValue;
        auto A = static_cast<const float*>(a);
        auto B = static_cast<const float*>(b);
        auto C = static_cast<float*>(c);
        switch (version) {
            case 1: {
                dim3 block(32, 8);
                dim3 grid(cdiv(M, 32), cdiv(N, 8));
                matmul_v1_naive<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
                break;
            }
            case 2: {
                dim3 block(32, 8);
                dim3 grid(cdiv(N, 32), cdiv(M, 8));
                matmul_v2_coalesced<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
                break;
            }
            case 3: {
                dim3 block(V3_TILE, V3_TILE);
                dim3 grid(cdiv(N, V3_TILE), cdiv(M, V3_TILE));
                matmul_v3_smem<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
                break;
            }
            default: {
                dim3 grid(cdiv(N, V4_BN), cdiv(M, V4_BM));
                if (ptrs16 && N % 4 == 0 && K % 4 == 0)
                    matmul_v4_regblock<true><<<grid, V4_THREADS, 0, stream>>>(A, B, C, M, N, K);
                else
                    matmul_v4_regblock<false><<<grid, V4_THREADS, 0, stream>>>(A, B, C, M, N, K);
            }
        }
        return cudaGetLastError();
    }
    if (version == 7) return launch_matmul_v7(a, b, c, M, N, K, dtype, v7_tile, stream);  // matmul_v7_wgmma.cu
    if (version == 5 || version == 6) {
        const bool aligned = ptrs16 && N % 8 == 0 && K % 8 == 0;
        if (dtype == 1) return launch_tensor_core<__half>(a, b, c, M, N, K, version, aligned, stream);
        if (dtype == 2) return launch_tensor_core<__nv_bfloat16>(a, b, c, M, N, K, version, aligned, stream);
        return cudaErrorInvalidValue;
    }
    return cudaErrorInvalidValue;
}
