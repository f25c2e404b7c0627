// a04 given code (identical in assignments/ and solutions/): the torch side of the op.
//
// The operator's schema, `<ns>::fused_gelu(Tensor x) -> Tensor` (and `fused_gelu_fast`
// for the --use_fast_math build), is defined from Python in fused_gelu.py together with
// its fake (meta) implementation, so torch.compile can trace the op on a machine that
// never built this file. Here we only register the CUDA kernel for it with
// TORCH_LIBRARY_IMPL. COURSE_NS (the impl's namespace, e.g. course_solutions) and
// COURSE_OP_NAME (fused_gelu, or fused_gelu_fast for the --use_fast_math build: fused_gelu.py's
// OP_NAMES) come from common.cuda_ext.load_op as -DCOURSE_NS=... -DCOURSE_OP_NAME=...; the
// extra macro levels expand them.
//
// Only device-generic c10 headers are used (c10::DeviceGuard, the current stream through
// the device-guard interface, i.e. what at::cuda::getCurrentCUDAStream() returns), so
// this file also compiles against a CPU-only torch for the CI syntax check.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#ifndef COURSE_NS
#define COURSE_NS course
#endif
#ifndef COURSE_OP_NAME
#define COURSE_OP_NAME fused_gelu
#endif
#define COURSE_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)
#define COURSE_STR_(x) #x
#define COURSE_STR(x) COURSE_STR_(x)

// From gelu_kernel.cu.
cudaError_t course_gelu_launch(const void* x, void* y, int64_t n, int dtype, cudaStream_t stream);

static at::Tensor fused_gelu_cuda(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda(), "fused_gelu: expected a CUDA tensor, got one on ", x.device());
  int code = -1;
  switch (x.scalar_type()) {
    case at::kFloat: code = 0; break;
    case at::kHalf: code = 1; break;
    case at::kBFloat16: code = 2; break;
    default: TORCH_CHECK(false, "fused_gelu: expected dtype float32, float16 or bfloat16, got ", x.scalar_type());
  }
  const c10::DeviceGuard guard(x.device());
  // A strided view is made contiguous first: one extra copy kernel (and pass over memory).
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());  // contiguous, like the fake says
  // The current CUDA stream of x's device (torch.cuda.current_stream()): the kernel is
  // ordered with the torch work around it, and honours `with torch.cuda.stream(s):`.
  const c10::Stream current = c10::impl::getDeviceGuardImpl(x.device().type())->getStream(x.device());
  const auto stream = static_cast<cudaStream_t>(current.native_handle());
  const cudaError_t err = course_gelu_launch(xc.data_ptr(), y.data_ptr(), y.numel(), code, stream);
  TORCH_CHECK(err == cudaSuccess, "fused_gelu: kernel launch failed: ", cudaGetErrorString(err));
  return y;
}

COURSE_LIBRARY_IMPL(COURSE_NS, CUDA, m) { m.impl(COURSE_STR(COURSE_OP_NAME), TORCH_FN(fused_gelu_cuda)); }
