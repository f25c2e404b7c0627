// Stage 7c: CPU check of the Hopper kernel's host-side TMA plan, no GPU needed. It includes
// solutions/a07_flash_attention/flash_fwd_hopper.cu with the driver's cuTensorMapEncodeTiled
// replaced by a mock that checks every argument against the documented limits and records it,
// then prints (JSON) what the kernel would use: the tensor maps of make_map, the expect-tx byte
// counts, the shared-memory plan and every wgmma descriptor (Plan<D>). layout_emu.py builds
// and runs this, then emulates TMA (boxes, zero fill, 128-byte swizzle) and the descriptors'
// canonical layouts byte by byte. Exit status 1 (and a message) on any violated limit.
//
//   nvcc -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -DA07C_SM90A \
//        tests/a07c/host_check.cu -o /tmp/a07c_host_check && /tmp/a07c_host_check
// The kernel file's call of the runtime's entry-point query gets the mock's name.
#include <cuda.h>
#include <cuda_runtime.h>
extern "C" cudaError_t a07c_mock_entry_point(const char* symbol, void** fn, unsigned int version,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult* status);
#define cudaGetDriverEntryPointByVersion a07c_mock_entry_point
#include "../../solutions/a07_flash_attention/flash_fwd_hopper.cu"
#undef cudaGetDriverEntryPointByVersion
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
struct Recorded {
    CUtensorMapDataType dt;
    cuuint32_t rank;
    uint64_t addr;
    cuuint64_t dims[5], strides[4];
    cuuint32_t box[5], estr[5];
    CUtensorMapInterleave il;
    CUtensorMapSwizzle sw;
    CUtensorMapFloatOOBfill oob;
};
Recorded last;
std::vector<Recorded> recorded;   // every encode call, in order
int failures = 0;
#define REQUIRE(cond, ...)                                        \
    do {                                                          \
        if (!(cond)) {                                            \
            std::fprintf(stderr, "a07c host check: " __VA_ARGS__); \
            std::fprintf(stderr, "  [%s]\n", #cond);              \
            ++failures;                                           \
        }                                                         \
    } while (0)

// The limits of cuTensorMapEncodeTiled (CUDA driver API reference) for what this kernel uses.
CUresult mock_encode(CUtensorMap*, CUtensorMapDataType dt, cuuint32_t rank, void* addr, const cuuint64_t* dims,
                     const cuuint64_t* strides, const cuuint32_t* box, const cuuint32_t* estr,
                     CUtensorMapInterleave il, CUtensorMapSwizzle sw, CUtensorMapL2promotion,
                     CUtensorMapFloatOOBfill oob) {
    last = Recorded{};
    last.dt = dt; last.rank = rank; last.addr = reinterpret_cast<uint64_t>(addr); last.il = il; last.sw = sw;
    last.oob = oob;
    REQUIRE(rank >= 1 && rank <= 5, "rank %u\n", rank);
    REQUIRE(dt == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, "data type %d\n", (int)dt);
    REQUIRE(last.addr % 16 == 0, "global address not 16-byte aligned\n");
    for (cuuint32_t i = 0; i < rank; ++i) {
        last.dims[i] = dims[i]; last.box[i] = box[i]; last.estr[i] = estr[i];
        REQUIRE(dims[i] >= 1 && dims[i] <= (1ull << 32), "globalDim[%u] = %llu\n", i, (unsigned long long)dims[i]);
        REQUIRE(box[i] >= 1 && box[i] <= 256, "boxDim[%u] = %u\n", i, box[i]);
        REQUIRE(estr[i] >= 1 && estr[i] <= 8, "elementStrides[%u] = %u\n", i, estr[i]);
    }
    // globalStrides: rank - 1 of them, in bytes, for dims 1.., multiples of 16, < 2^40, and each
    // at least the extent of the dimension below (no overlapping rows / heads).
    cuuint64_t below = dims[0] * 2;
    for (cuuint32_t i = 0; i + 1 < rank; ++i) {
        last.strides[i] = strides[i];
        REQUIRE(strides[i] % 16 == 0, "globalStrides[%u] = %llu not a multiple of 16\n", i, (unsigned long long)strides[i]);
        REQUIRE(strides[i] < (1ull << 40), "globalStrides[%u] too large\n", i);
        REQUIRE(strides[i] >= below, "globalStrides[%u] = %llu < %llu (overlap)\n", i, (unsigned long long)strides[i],
                (unsigned long long)below);
        below = strides[i] * dims[i + 1];
    }
    REQUIRE((box[0] * 2) % 16 == 0, "boxDim[0] * 2 bytes = %u not a multiple of 16 (interleave none)\n", box[0] * 2);
    REQUIRE(il == CU_TENSOR_MAP_INTERLEAVE_NONE, "interleave\n");
    REQUIRE(sw == CU_TENSOR_MAP_SWIZZLE_128B, "the wgmma descriptors assume the 128-byte swizzle\n");
    REQUIRE(box[0] * 2 <= 128, "inner box of %u bytes exceeds the 128-byte swizzle span\n", box[0] * 2);
    REQUIRE(oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE, "out-of-bounds fill must be zeros (FILL_NONE)\n");
    recorded.push_back(last);
    return CUDA_SUCCESS;
}
}  // namespace

extern "C" cudaError_t a07c_mock_entry_point(const char* symbol, void** fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
    REQUIRE(std::string(symbol) == "cuTensorMapEncodeTiled", "symbol %s\n", symbol);
    *fn = reinterpret_cast<void*>(&mock_encode);
    if (status) *status = cudaDriverEntryPointSuccess;
    return cudaSuccess;
}

static uint64_t box_bytes(const Recorded& r) {
    uint64_t b = 2;
    for (cuuint32_t i = 0; i < r.rank; ++i) b *= r.box[i];
    return b;
}

static void print_map(const char* name, const Recorded& r) {
    std::printf("\"%s\": {\"dims\": [", name);
    for (cuuint32_t i = 0; i < r.rank; ++i) std::printf("%s%llu", i ? ", " : "", (unsigned long long)r.dims[i]);
    std::printf("], \"strides\": [");
    for (cuuint32_t i = 0; i + 1 < r.rank; ++i) std::printf("%s%llu", i ? ", " : "", (unsigned long long)r.strides[i]);
    std::printf("], \"box\": [");
    for (cuuint32_t i = 0; i < r.rank; ++i) std::printf("%s%u", i ? ", " : "", r.box[i]);
    std::printf("]}");
}

template <int D>
static void check(int BH, int S, bool first) {
    using namespace a07c;
    using C = Cfg<D>;
    using P = Plan<D>;
    static __nv_bfloat16 dummy[4][64] __attribute__((aligned(256)));   // q, k, v, o: never touched
    // The maps exactly as launch() encodes them (without a GPU it then fails at
    // cudaFuncSetAttribute, before any launch): Q, K, V in that order.
    recorded.clear();
    launch<D, false>(dummy[0], dummy[1], dummy[2], dummy[3], nullptr, BH, S, 132, 0);
    REQUIRE(recorded.size() == 3, "launch encoded %zu tensor maps, expected 3 (Q, K, V)\n", recorded.size());
    if (recorded.size() != 3) return;
    const Recorded mq = recorded[0], mk = recorded[1], mv = recorded[2];
    REQUIRE(mq.addr == (uint64_t)dummy[0] && mk.addr == (uint64_t)dummy[1] && mv.addr == (uint64_t)dummy[2],
            "the Q, K, V maps do not point at q, k, v\n");
    REQUIRE(std::memcmp(mk.box, mv.box, sizeof mk.box) == 0 && std::memcmp(mk.dims, mv.dims, sizeof mk.dims) == 0 &&
                std::memcmp(mk.strides, mv.strides, sizeof mk.strides) == 0,
            "K and V maps differ (both are [B*H, S, D] boxes of BN rows)\n");
    // The copies a barrier waits for are PANELS boxes; the count TMA delivers is always the full
    // box (rows past S are zero-filled and counted), so expect-tx must be exactly PANELS boxes.
    REQUIRE(C::Q_BYTES == C::PANELS * box_bytes(mq), "D=%d: expect-tx Q_BYTES %d != %d boxes of %llu bytes\n", D,
            C::Q_BYTES, C::PANELS, (unsigned long long)box_bytes(mq));
    REQUIRE(C::KV_BYTES == C::PANELS * box_bytes(mk), "D=%d: expect-tx KV_BYTES %d != %d boxes of %llu bytes\n", D,
            C::KV_BYTES, C::PANELS, (unsigned long long)box_bytes(mk));
    REQUIRE(mq.box[0] == PANEL && mk.box[0] == PANEL && mq.box[1] == BM && mk.box[1] == BN && mq.box[2] == 1 &&
                mk.box[2] == 1, "box shapes\n");
    REQUIRE(C::Q_PANEL_BYTES == box_bytes(mq) && C::KV_PANEL_BYTES == box_bytes(mk), "panel bytes != box bytes\n");
    REQUIRE(mq.dims[0] == (cuuint64_t)D && mq.dims[1] == (cuuint64_t)S && mq.dims[2] == (cuuint64_t)BH,
            "dims must be {D, S, B*H}, innermost first, so that rows >= S of a head are zero-filled\n");
    REQUIRE(C::Q_BYTES + 2 * C::STAGES * C::KV_BYTES + 1023 <= C::SMEM_BYTES, "plan exceeds the dynamic smem\n");
    const uint32_t base = 1024;   // any 1024-aligned base: the kernel rounds its dynamic smem up to one
    std::printf("%s{\"D\": %d, \"BH\": %d, \"S\": %d, \"BM\": %d, \"BN\": %d, \"PANELS\": %d, \"STAGES\": %d, "
                "\"Q_BYTES\": %d, \"KV_BYTES\": %d, \"SMEM_BYTES\": %d, \"base\": %u, ",
                first ? "" : ",\n", D, BH, S, BM, BN, C::PANELS, C::STAGES, C::Q_BYTES, C::KV_BYTES, C::SMEM_BYTES,
                base);
    print_map("map_q", mq);
    std::printf(", ");
    print_map("map_k", mk);
    std::printf(", ");
    print_map("map_v", mv);
    std::printf(", \"q_panel\": [");
    for (int p = 0; p < C::PANELS; ++p) std::printf("%s%u", p ? ", " : "", P::q_panel(base, p));
    std::printf("], \"k_panel\": [");
    for (int s = 0; s < C::STAGES; ++s)
        for (int p = 0; p < C::PANELS; ++p) std::printf("%s%u", s + p ? ", " : "", P::k_panel(base, s, p));
    std::printf("], \"v_panel\": [");
    for (int s = 0; s < C::STAGES; ++s)
        for (int p = 0; p < C::PANELS; ++p) std::printf("%s%u", s + p ? ", " : "", P::v_panel(base, s, p));
    std::printf("], \"desc_q\": [");
    for (int c = 0; c < CONSUMERS; ++c)
        for (int k = 0; k < D / 16; ++k) std::printf("%s\"%llu\"", c + k ? ", " : "", (unsigned long long)P::desc_q(base, c, k));
    std::printf("], \"desc_k\": [");
    for (int s = 0; s < C::STAGES; ++s)
        for (int k = 0; k < D / 16; ++k) std::printf("%s\"%llu\"", s + k ? ", " : "", (unsigned long long)P::desc_k(base, s, k));
    std::printf("], \"desc_v\": [");
    for (int s = 0; s < C::STAGES; ++s)
        for (int kk = 0; kk < BN / 16; ++kk)
            std::printf("%s\"%llu\"", s + kk ? ", " : "", (unsigned long long)P::desc_v(base, s, kk));
    std::printf("]}");
}

int main() {
    // No device, ever: launch() below must stop at cudaFuncSetAttribute even on a GPU machine
    // (its pointers are a host dummy), so the runtime is started with no device visible.
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    int n = -1;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
        std::fprintf(stderr, "a07c host check: a CUDA device is visible; refusing to run launch()\n");
        return 2;
    }
    std::printf("[\n");
    bool first = true;
    const int shapes[][2] = {{1, 1}, {6, 17}, {2, 128}, {3, 130}, {2, 300}, {5, 333}, {2, 4096}, {65535, 1}};
    for (const auto& sh : shapes) {
        check<64>(sh[0], sh[1], first);
        first = false;
        check<128>(sh[0], sh[1], first);
    }
    std::printf("\n]\n");
    if (failures) std::fprintf(stderr, "a07c host check: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
