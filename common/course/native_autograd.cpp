// Native autograd for a plan of Triton launches (common/course/native.py; lecture 3, "Host overhead").
//
// A three-input op (stage 7's flash attention: q, k, v -> O) whose forward and backward are fixed lists of
// launches of kernels Triton has already compiled. Python records, once per key (shapes, strides, dtypes),
// what the launches are: each kernel's CUfunction, grid, warps, shared memory and its parameters (a tensor
// "slot", or an integer or float fixed by the key), and the tensors each step allocates. This file replays
// them: the forward as a torch::autograd::Function, whose backward node is C++, so that a training step's
// backward runs no Python on the autograd engine's thread. The parameters are packed as Triton's own
// launcher packs them (triton/backends/nvidia/driver.py, release 3.6): every non-constexpr parameter in
// order, then the global and profile scratch pointers (null: a plan only takes kernels that need none).
#include <torch/extension.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <cuda.h>
#include <dlfcn.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The driver entry points, from libcuda.so.1 as Triton's launcher takes them (no link to the CUDA libraries).
struct Driver {
  CUresult (*launch_ex)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
};

const Driver& driver() {
  static Driver d = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(lib, "native autograd: cannot open libcuda.so.1");
    Driver d;
    auto get = [lib](const char* name) {
      void* f = dlsym(lib, name);
      TORCH_CHECK(f, "native autograd: libcuda.so.1 has no ", name);
      return f;
    };
    d.launch_ex = reinterpret_cast<decltype(d.launch_ex)>(get("cuLaunchKernelEx"));
    d.ctx_get_current = reinterpret_cast<decltype(d.ctx_get_current)>(get("cuCtxGetCurrent"));
    d.device_get = reinterpret_cast<decltype(d.device_get)>(get("cuDeviceGet"));
    d.primary_ctx_retain = reinterpret_cast<decltype(d.primary_ctx_retain)>(get("cuDevicePrimaryCtxRetain"));
    d.ctx_set_current = reinterpret_cast<decltype(d.ctx_set_current)>(get("cuCtxSetCurrent"));
    return d;
  }();
  return d;
}

// A thread that never touched CUDA (a new Python thread, the autograd engine's device thread before its
// first CUDA op) has no current context, and a launch there fails hard: make the device's primary context
// (the one torch and Triton use) current, as Triton's launcher does before every launch.
void ensure_context(int device) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  TORCH_CHECK(d.ctx_get_current(&ctx) == CUDA_SUCCESS, "native autograd: cuCtxGetCurrent failed");
  if (ctx != nullptr) return;
  CUdevice dev;
  TORCH_CHECK(d.device_get(&dev, device) == CUDA_SUCCESS && d.primary_ctx_retain(&ctx, dev) == CUDA_SUCCESS &&
              d.ctx_set_current(ctx) == CUDA_SUCCESS, "native autograd: no CUDA context for device ", device);
}

// One parameter: kind 0 = the address of tensor slot `value`, 1 = int32, 2 = int64, 3 = 32-bit float bits.
struct Arg {
  int kind;
  int64_t value;
};

struct Launch {
  CUfunction fn;
  unsigned grid[3];
  unsigned warps, ctas, shared;
  bool pdl, coop;
  std::vector<Arg> args;
};

struct Alloc {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};

struct Step {
  std::vector<Alloc> allocs;      // appended to the slots, in order
  std::vector<Launch> launches;
};

struct Plan {
  int device;
  // forward: slots = the 3 inputs, then fwd.allocs; returns slot `out`, saves slots `saved`
  Step fwd;
  int64_t out;
  std::vector<int64_t> saved;
  std::vector<bool> aligned;      // each input's address a multiple of 16 when the kernels were compiled
  // backward: slots = the saved tensors, the output's gradient (in grad_sizes/grad_strides, 16-byte
  // aligned: else copied into that layout), then bwd.allocs; returns slots `grads` (one per input)
  Step bwd;
  std::vector<int64_t> grad_sizes, grad_strides;
  std::vector<int64_t> grads;
  int64_t grad_like;              // the saved slot holding the output
};

std::mutex plans_mutex;
std::vector<std::shared_ptr<const Plan>> plans;

void run(const Step& step, std::vector<at::Tensor>& slots, const at::TensorOptions& like, int device) {
  ensure_context(device);
  for (const auto& a : step.allocs)
    slots.push_back(at::empty_strided(a.sizes, a.strides, like.dtype(a.dtype)));
  // the current CUDA device's current stream, through c10's device-guard interface (no CUDA build of
  // torch's headers needed: this file compiles against the CPU wheel's headers plus cuda.h)
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  auto stream = static_cast<CUstream>(guard->getStream(guard->getDevice()).native_handle());
  for (const auto& l : step.launches) {
    const size_t n = l.args.size();
    std::vector<uint64_t> storage(n + 2, 0);   // the last two: global and profile scratch, null
    std::vector<void*> params(n + 2);
    for (size_t i = 0; i < n; ++i) {
      const Arg& a = l.args[i];
      if (a.kind == 0) {
        storage[i] = reinterpret_cast<uint64_t>(slots[a.value].data_ptr());
      } else if (a.kind == 1) {
        int32_t v = static_cast<int32_t>(a.value);
        std::memcpy(&storage[i], &v, sizeof v);
      } else if (a.kind == 2) {
        storage[i] = static_cast<uint64_t>(a.value);
      } else {
        uint32_t v = static_cast<uint32_t>(a.value);
        std::memcpy(&storage[i], &v, sizeof v);
      }
      params[i] = &storage[i];
    }
    params[n] = &storage[n];
    params[n + 1] = &storage[n + 1];
    CUlaunchAttribute attrs[4] = {};
    unsigned na = 0;
    if (l.pdl) {
      attrs[na].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[na].value.programmaticStreamSerializationAllowed = 1;
      ++na;
    }
    if (l.coop) {
      attrs[na].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attrs[na].value.cooperative = 1;
      ++na;
    }
    if (l.ctas != 1) {
      attrs[na] = CUlaunchAttribute{};
      attrs[na].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attrs[na].value.clusterDim.x = l.ctas;
      attrs[na].value.clusterDim.y = 1;
      attrs[na].value.clusterDim.z = 1;
      ++na;
      attrs[na].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
      attrs[na].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
      ++na;
    }
    CUlaunchConfig config{};
    config.gridDimX = l.grid[0] * l.ctas;
    config.gridDimY = l.grid[1];
    config.gridDimZ = l.grid[2];
    config.blockDimX = 32 * l.warps;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = l.shared;
    config.hStream = stream;
    config.attrs = attrs;
    config.numAttrs = na;
    if (config.gridDimX * config.gridDimY * config.gridDimZ == 0) continue;
    CUresult r = driver().launch_ex(&config, l.fn, params.data(), nullptr);
    TORCH_CHECK(r == CUDA_SUCCESS, "native autograd: cuLaunchKernelEx failed with CUresult ", static_cast<int>(r));
  }
}

struct Native : public torch::autograd::Function<Native> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                            int64_t id) {
    std::shared_ptr<const Plan> plan;
    {
      std::lock_guard<std::mutex> lock(plans_mutex);
      plan = plans.at(id);
    }
    std::vector<at::Tensor> slots{a, b, c};
    slots.reserve(3 + plan->fwd.allocs.size());
    run(plan->fwd, slots, a.options(), plan->device);
    variable_list saved;
    for (auto s : plan->saved) saved.push_back(slots[s]);
    ctx->save_for_backward(saved);
    ctx->saved_data["id"] = id;
    return slots[plan->out];
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    std::shared_ptr<const Plan> plan;
    {
      std::lock_guard<std::mutex> lock(plans_mutex);
      plan = plans.at(ctx->saved_data["id"].toInt());
    }
    std::vector<at::Tensor> slots = ctx->get_saved_variables();
    at::Tensor g = grad_outputs[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor& o = slots[plan->grad_like];   // the saved output: the gradient's dtype and device
    if (g.sizes() != at::IntArrayRef(plan->grad_sizes) || g.strides() != at::IntArrayRef(plan->grad_strides) ||
        reinterpret_cast<uintptr_t>(g.data_ptr()) % 16 != 0 || g.scalar_type() != o.scalar_type()) {
      // the kernels were compiled for a gradient in this layout: copy one that is not
      at::Tensor h = at::empty_strided(plan->grad_sizes, plan->grad_strides, o.options());
      h.copy_(g);
      g = h;
    }
    slots.push_back(g);
    run(plan->bwd, slots, o.options(), plan->device);
    variable_list out;
    for (auto s : plan->grads) out.push_back(s >= 0 ? slots[s] : at::Tensor());
    out.push_back(at::Tensor());     // the plan id
    return out;
  }
};

int64_t add_plan(int64_t device, py::tuple fwd, int64_t out, std::vector<int64_t> saved, std::vector<bool> aligned,
                 py::tuple bwd, std::vector<int64_t> grad_sizes, std::vector<int64_t> grad_strides,
                 std::vector<int64_t> grads, int64_t grad_like) {
  // fwd / bwd: (allocs, launches); alloc: (sizes, strides, dtype); launch: (function, (gx, gy, gz), warps,
  // ctas, shared, pdl, coop, ((kind, value), ...))
  auto step = [](py::tuple t) {
    Step s;
    for (auto a : t[0].cast<py::list>()) {
      auto at = a.cast<py::tuple>();
      s.allocs.push_back(Alloc{at[0].cast<std::vector<int64_t>>(), at[1].cast<std::vector<int64_t>>(),
                               torch::python::detail::py_object_to_dtype(at[2])});
    }
    for (auto l : t[1].cast<py::list>()) {
      auto lt = l.cast<py::tuple>();
      Launch L;
      L.fn = reinterpret_cast<CUfunction>(lt[0].cast<uint64_t>());
      auto g = lt[1].cast<std::vector<int64_t>>();
      TORCH_CHECK(g.size() == 3, "native autograd: a grid has three dimensions");
      for (int i = 0; i < 3; ++i) L.grid[i] = static_cast<unsigned>(g[i]);
      L.warps = lt[2].cast<unsigned>();
      L.ctas = lt[3].cast<unsigned>();
      L.shared = lt[4].cast<unsigned>();
      L.pdl = lt[5].cast<bool>();
      L.coop = lt[6].cast<bool>();
      for (auto a : lt[7].cast<py::list>()) {
        auto p = a.cast<py::tuple>();
        L.args.push_back(Arg{p[0].cast<int>(), p[1].cast<int64_t>()});
      }
      s.launches.push_back(std::move(L));
    }
    return s;
  };
  auto plan = std::make_shared<Plan>();
  plan->device = static_cast<int>(device);
  plan->fwd = step(fwd);
  plan->out = out;
  plan->saved = std::move(saved);
  plan->aligned = std::move(aligned);
  plan->bwd = step(bwd);
  plan->grad_sizes = std::move(grad_sizes);
  plan->grad_strides = std::move(grad_strides);
  plan->grads = std::move(grads);
  plan->grad_like = grad_like;
  TORCH_CHECK(plan->aligned.size() == 3 && plan->grads.size() == 3, "native autograd: a plan has three inputs");
  std::lock_guard<std::mutex> lock(plans_mutex);
  plans.push_back(plan);
  return static_cast<int64_t>(plans.size() - 1);
}

// Plan `id` on (a, b, c): the output (recorded for autograd), or None where the call is not the plan's
// (another current device, or an input whose 16-byte alignment differs from the compiled kernels'): the
// caller then takes its Python path.
py::object apply(int64_t id, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  std::shared_ptr<const Plan> plan;
  {
    std::lock_guard<std::mutex> lock(plans_mutex);
    plan = plans.at(id);
  }
  if (c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() != plan->device) return py::none();
  const at::Tensor* in[3] = {&a, &b, &c};
  for (int i = 0; i < 3; ++i)
    if ((reinterpret_cast<uintptr_t>(in[i]->data_ptr()) % 16 == 0) != plan->aligned[i]) return py::none();
  return py::cast(Native::apply(a, b, c, id));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_plan", &add_plan, "register a plan of launches; returns its id");
  m.def("apply", &apply, "run plan id's forward on three inputs (autograd records its backward)");
}
