// Registers the torch operator of stage 7c, the Hopper flash-attention forward (given code:
// identical in assignments/ and solutions/). The kernel and its launcher live in
// flash_fwd_hopper.cu.
//
//   attention_fwd_hopper(Tensor q, Tensor k, Tensor v, bool causal, Tensor(a!) o, Tensor(b!) lse, int stream) -> ()
//
// q, k, v, o: contiguous bf16 [B, H, S, d] CUDA tensors, d = 64 or 128; lse: contiguous fp32
// [B, H, S]. `stream` is the cudaStream_t as an integer (the Python wrapper passes
// torch.cuda.current_stream(device).cuda_stream), which keeps this file free of torch's CUDA
// headers, so it compiles (as a check) against a CPU-only torch. The namespace comes from
// -DCOURSE_NS (see common.cuda_ext.load_op).
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

cudaError_t launch_attention_fwd_hopper(const void* q, const void* k, const void* v, void* o, float* lse, int BH, int S,
                                    int D, bool causal, cudaStream_t stream);

namespace {

void attention_fwd_hopper(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, at::Tensor& o,
                      at::Tensor& lse, int64_t stream) {
    const at::Tensor* all[] = {&q, &k, &v, &o};
    for (const at::Tensor* t : all) {
        TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->dim() == 4,
                    "a07c attention_fwd_hopper: q, k, v and o must be contiguous bf16 CUDA tensors [B, H, S, d], got ",
                    t->scalar_type(), " ", t->sizes(), " on ", t->device());
        TORCH_CHECK(t->sizes() == q.sizes(), "a07c attention_fwd_hopper: q, k, v and o must share one shape, got ",
                    q.sizes(), " and ", t->sizes());
    }
    TORCH_CHECK(lse.is_cuda() && lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.dim() == 3 &&
                    lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
                "a07c attention_fwd_hopper: lse must be a contiguous fp32 CUDA tensor [B, H, S], got ", lse.sizes());
    const int64_t D = q.size(3), BH = q.size(0) * q.size(1), S = q.size(2);
    TORCH_CHECK(D == 64 || D == 128, "a07c attention_fwd_hopper: head dim must be 64 or 128, got ", D);
    TORCH_CHECK(BH <= 65535 && S < (1LL << 31), "a07c attention_fwd_hopper: sizes too large (B*H <= 65535)");
    const c10::DeviceGuard guard(q.device());
    cudaError_t err = launch_attention_fwd_hopper(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                              lse.data_ptr<float>(), (int)BH, (int)S, (int)D, causal,
                                              reinterpret_cast<cudaStream_t>(stream));
    TORCH_CHECK(err == cudaSuccess, "a07c attention_fwd_hopper launch failed: ", cudaGetErrorString(err),
                err == cudaErrorNotSupported ? " (needs an sm_90 GPU and the sm_90a build)" : "");
}

}  // namespace

// A FRAGMENT, not TORCH_LIBRARY: stage 6's matmul op already owns the impl's namespace
// (TORCH_LIBRARY(COURSE_NS)), and both extensions may be loaded in one process.
#define COURSE_LIBRARY_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
COURSE_LIBRARY_FRAGMENT(COURSE_NS, m) {
    m.def("attention_fwd_hopper(Tensor q, Tensor k, Tensor v, bool causal, Tensor(a!) o, Tensor(b!) lse, int stream) -> ()");
    m.impl("attention_fwd_hopper", c10::DispatchKey::CUDA, TORCH_FN(attention_fwd_hopper));
}
