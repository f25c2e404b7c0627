// Registers the torch operators of assignment 6 (given code: identical in assignments/
// and solutions/). The kernels and their launcher live in matmul_kernels.cu.
//
//   matmul_out(Tensor a, Tensor b, int version, Tensor(a!) out, int stream, int tile=-1) -> Tensor(a!)
//
// `tile` picks version 7's tile shape (-1: the kernel's own choice; 0..3, matmul_v7_wgmma.cu).
// `stream` is the cudaStream_t to launch on, as an integer: the Python wrapper passes
// torch.cuda.current_stream(device).cuda_stream. Taking it from Python keeps this file
// free of torch's CUDA headers, so it compiles (as a check) against a CPU-only torch.
//
// a [M, K] and b [K, N] are contiguous (row-major) CUDA tensors of one dtype: float32 for
// versions 1-4, float16/bfloat16 for versions 5-7. The namespace comes from -DCOURSE_NS
// (see common.cuda_ext.load_op), so several impls can be loaded in one process.
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

cudaError_t launch_matmul(const void* a, const void* b, void* c, int M, int N, int K, int dtype,
                          int version, int v7_tile, cudaStream_t stream);

namespace {

int dtype_code(const at::Tensor& t) {
    switch (t.scalar_type()) {
        case at::kFloat: return 0;
        case at::kHalf: return 1;
        case at::kBFloat16: return 2;
        default: TORCH_CHECK(false, "a06 matmul: unsupported dtype ", t.scalar_type());
    }
    return -1;
}

at::Tensor& matmul_out(const at::Tensor& a, const at::Tensor& b, int64_t version, at::Tensor& out, int64_t stream,
                       int64_t tile) {
    TORCH_CHECK(version >= 1 && version <= 7, "a06 matmul: version must be 1..7, got ", version);
    TORCH_CHECK(tile == -1 || (version == 7 && tile >= 0 && tile <= 3),
                "a06 matmul: tile picks one of version 7's four tile shapes (0..3, or -1), got ", tile,
                " with version ", version);
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && out.is_cuda(), "a06 matmul: a, b and out must be CUDA tensors");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "a06 matmul: expected 2-D a [M, K] and b [K, N], got ",
                a.sizes(), " and ", b.sizes());
    TORCH_CHECK(a.size(1) == b.size(0), "a06 matmul: inner dimensions differ: a ", a.sizes(), ", b ", b.sizes());
    TORCH_CHECK(a.scalar_type() == b.scalar_type() && out.scalar_type() == a.scalar_type(),
                "a06 matmul: a, b and out must share one dtype");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous(),
                "a06 matmul: a, b and out must be contiguous (row-major)");
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    TORCH_CHECK(out.size(0) == M && out.size(1) == N && out.dim() == 2, "a06 matmul: out must have shape [",
                M, ", ", N, "], got ", out.sizes());
    TORCH_CHECK(M < (1LL << 31) && N < (1LL << 31) && K < (1LL << 31), "a06 matmul: sizes too large");
    const int code = dtype_code(a);
    TORCH_CHECK((version <= 4) == (code == 0),
                "a06 matmul: versions 1-4 take float32, versions 5-7 take float16/bfloat16; got version ",
                version, " with ", a.scalar_type());
    const c10::DeviceGuard guard(a.device());
    cudaError_t err = launch_matmul(a.data_ptr(), b.data_ptr(), out.data_ptr(), (int)M, (int)N, (int)K, code,
                                    (int)version, (int)tile, reinterpret_cast<cudaStream_t>(stream));
    TORCH_CHECK(err == cudaSuccess, "a06 matmul v", version, " launch failed: ", cudaGetErrorString(err));
    return out;
}

}  // namespace

#define COURSE_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
COURSE_LIBRARY(COURSE_NS, m) {
    m.def("matmul_out(Tensor a, Tensor b, int version, Tensor(a!) out, int stream, int tile=-1) -> Tensor(a!)");
    m.impl("matmul_out", c10::DispatchKey::CUDA, TORCH_FN(matmul_out));
}
