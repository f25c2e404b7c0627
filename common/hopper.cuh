// Hopper (sm_90a) PTX building blocks, given code shared by stage 6's matmul v7
// (aNN_matmul/matmul_v7_wgmma.cu) and stage 7c's attention forward (flash_fwd_hopper.cu):
// mbarriers, TMA loads and tensor maps, wgmma descriptors and fences, setmaxnreg.
// The kernels include it as "hopper.cuh" (common.cuda_ext puts common/ on the include path)
// and call these functions unqualified (`using namespace hopper;`).
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the driver call is looked up at run time)
#include <cuda_runtime.h>
#include <stdint.h>

#include <cstdio>

// wgmma and setmaxnreg exist only in the sm_90a target; other targets get the kernels' stubs.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HOPPER_HAS_WGMMA 1
#else
#define HOPPER_HAS_WGMMA 0
#endif

// Watchdog of mbar_wait: a wait that never ends (a wrong parity, a byte count TMA never delivers)
// traps after HOPPER_HANG_NS nanoseconds of the GPU's %globaltimer (default 10 s) instead of
// hanging the GPU: the launch fails with "unspecified launch failure". It is timed, not counted:
// try_wait suspends the thread for a system-dependent time that the PTX ISA leaves unspecified,
// so a count of tries has no known duration. -DHOPPER_HANG_NS=0 leaves it out. -DHOPPER_DEBUG_HANG
// also prints which barrier (lane 0 of each stuck warp), but printf is a function call, and a call
// anywhere in a kernel makes ptxas serialise every wgmma (C7510): debug builds only.
#ifndef HOPPER_HANG_NS
#define HOPPER_HANG_NS 10000000000ull
#endif

namespace hopper {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------- mbarriers
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Arrive once and announce `bytes` of TMA traffic that must land before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ uint32_t mbar_try_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done;
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}
// Wait until the barrier's phase with this parity (0, 1, 0, ...) has completed. A fresh
// barrier is in phase 0, so waiting for parity 1 returns at once ("the previous phase").
// With the watchdog above.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    if (mbar_try_wait(bar, parity)) return;
#if HOPPER_HANG_NS
    const uint64_t t0 = globaltimer_ns();
#endif
    while (!mbar_try_wait(bar, parity)) {
#if HOPPER_HANG_NS
        if (globaltimer_ns() - t0 > (uint64_t)(HOPPER_HANG_NS)) {
#ifdef HOPPER_DEBUG_HANG
            if ((threadIdx.x & 31) == 0)
                printf("mbarrier wait stuck: block (%d, %d) thread %d, barrier at smem 0x%x, parity %u\n",
                       (int)blockIdx.x, (int)blockIdx.y, (int)threadIdx.x, bar, parity);
#endif
            __trap();
        }
#endif
    }
}

// ---------------------------------------------------------------- TMA
// Copy the box at (x = innermost coordinate, y = row) of the 2-D `map` into shared memory at
// `dst`; completion is counted in bytes on `bar`. Outside the tensor the box is zero-filled.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar) : "memory");
}
// The same for a 3-D `map` (x = column, y = row, z = e.g. batch*head). Rows past the map's
// dim 1 are zero-filled, and the full box's bytes are still counted.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int x, int y, int z, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar) : "memory");
}

// ---------------------------------------------------------------- wgmma
// Shared-memory matrix descriptor: start address, leading/stride byte offsets (all in 16-byte
// units), swizzle mode 1 = 128-byte swizzle (the layout TMA wrote). constexpr: a CPU can check it.
__host__ __device__ constexpr uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
#if HOPPER_HAS_WGMMA
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Move registers from the warpgroups that need fewer (the producer) to those that need more.
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
#endif  // HOPPER_HAS_WGMMA

// ---------------------------------------------------------------- host: tensor maps
// cuTensorMapEncodeTiled is a driver API call; fetch it through the runtime so the
// extension needs no -lcuda.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled encode_tiled() {
    static EncodeTiled fn = nullptr;
    if (!fn) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess && q == cudaDriverEntryPointSuccess)
            fn = reinterpret_cast<EncodeTiled>(p);
    }
    return fn;
}

}  // namespace hopper
