"""The "is it a kernel?" check, shared by the graded tests and the grader.

A stage asks for a kernel (a Triton program, a CUDA op, a tiled loop): a submission that
calls the PyTorch op it replaces gets the right numbers because PyTorch computed them, so
no value test can tell. What each graded callable may not call is written once, as a
:class:`Forbidden` in its stage's ``stage.py``, and checked the same way by pytest (:func:`assert_is_kernel`) and by
the grader's trials (traced in common/course/grade/worker.py, judged in common/course/grade/judge.py through
:func:`forbidden_ops` and :func:`forbidden_kernels`):

* aten ops, from a dispatch trace of the call (``TorchDispatchMode``; CPU and GPU alike):
  ``torch.matmul`` where a matmul kernel was asked for shows as ``aten.mm``;
* torch-level functions, from a ``TorchFunctionMode`` trace, for composites that leave no
  aten op of their own (``F.linear`` is an ``aten.addmm``, which a backend may call);
* GPU kernel names, from ``torch.profiler`` on a GPU: a cuBLAS or PyTorch kernel where the
  stage's own kernel should run.

Stage 7a's memory contract (never more than one [block_m, block_n] tile of scores) is
checked the same way on any device: :func:`largest_new_tensor` traces every tensor a
call creates.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import HAS_CUDA
from .profiling import OpTrace, in_interpreted_kernel, profile, trace_ops

# ----------------------------------------------------------------------------- the work, by kind
#: aten ops by name: "aten.exp" is the op exp and its in-place form exp_, in any overload
#: (aten.exp.default, aten.exp_.default, aten.exp.out), never a longer name that starts the same
#: (aten.expand is a view, aten.expm1 another op). A pattern ending in "*" is a prefix
#: ("aten._scaled_dot_product*": every fused attention op). See :func:`op_matches`.
TORCH_ARITH = ("aten.add", "aten.sub", "aten.rsub", "aten.mul", "aten.div", "aten.tanh", "aten.exp", "aten.exp2",
               "aten.expm1", "aten.gelu", "aten.pow", "aten.addcmul", "aten.addcdiv", "aten.sigmoid", "aten.where",
               "aten.lerp")
TORCH_GEMM = ("aten.mm", "aten.bmm", "aten.addmm", "aten.addbmm", "aten.matmul", "aten.linear", "aten.baddbmm",
              "aten.einsum", "aten.dot", "aten.vdot", "aten.mv", "aten.addmv", "aten.tensordot", "aten._scaled_mm")
TORCH_ATTENTION = ("aten._scaled_dot_product*", "aten.scaled_dot_product*", "aten._flash_attention*",
                   "aten._efficient_attention*", "aten._cudnn_attention*")
TORCH_NORM = ("aten.native_layer_norm", "aten.layer_norm", "aten.var", "aten.var_mean", "aten.std", "aten.std_mean",
              "aten.mean", "aten.rsqrt", "aten.sqrt")
TORCH_GELU = ("aten.gelu", "aten.tanh", "aten.erf", "aten.erfc", "aten.sigmoid")
TORCH_SOFTMAX = ("aten._softmax", "aten.softmax", "aten._safe_softmax", "aten._log_softmax", "aten.log_softmax",
                 "aten.logsumexp", "aten.exp", "aten.exp2")
#: Torch-side KV-cache writes: indexed writes, and slice assignment (``cache[b, :, s] = k`` is a
#: view, then aten.copy_ into it). Under the Triton interpreter the copies the interpreter makes
#: to run a kernel are not traced (common.profiling), so copy_ counts on the CPU too.
TORCH_SCATTER = ("aten.index_put", "aten._index_put_impl", "aten.scatter", "aten.scatter_add", "aten.slice_scatter",
                 "aten.select_scatter", "aten.index_copy", "aten.masked_scatter")
#: Ops that copy a tensor's data into new memory: a weight read "in place" must not meet one per call.
TORCH_COPIES = ("aten.clone", "aten._to_copy", "aten.copy", "aten.cat", "aten.stack", "aten.index_select",
                "aten.gather", "aten.t_copy", "aten.transpose_copy", "aten.permute_copy", "aten.contiguous")
#: GPU kernel names (substrings, any case) that mean PyTorch / cuBLAS / cuDNN did the work.
ATEN_KERNELS = ("at::native", "elementwise_kernel")
BLAS_KERNELS = ("gemm", "xmma", "cutlass", "cublas", "gemv", "splitK")
ATTN_KERNELS = ("flash_fwd", "flash_bwd", "fmha", "cudnn", "pytorch_flash", "efficient_attention")
NORM_KERNELS = ("layer_norm", "LayerNormForward", "RowwiseMoments")
ACT_KERNELS = ("GeluCUDAKernel", "tanh_kernel", "softmax")
#: PyTorch's copy (and cast) kernel: an elementwise_kernel that moves data and computes nothing; a Forbidden's
#: ``allow`` where its contract permits a copy (a layout a view cannot express).
COPY_KERNELS = ("direct_copy_kernel",)
#: The baseline stage 3 is timed against: a composite (an aten.addmm underneath).
BASELINE_FUNCTIONS = ("torch.nn.functional.linear",)
#: SDPA by name: with inputs that require grad (or on some backends) it runs as its math
#: composite, and the dispatch trace sees only bmm and softmax, which stage 7a may call.
ATTENTION_FUNCTIONS = ("torch.nn.functional.scaled_dot_product_attention",)


@dataclass(frozen=True)
class Forbidden:
    """What a call may not run: aten op-name prefixes (``ops``), GPU kernel-name substrings
    (``kernels``) and torch-level function names (``functions``, see profiling.function_name)."""
    ops: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    #: what to call instead, where the contract names a PyTorch op (the error message says it)
    use: str = ""
    #: kernel-name substrings exempt from ``kernels`` (e.g. COPY_KERNELS where the contract allows a copy)
    allow: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ops or self.kernels or self.functions)


NOTHING = Forbidden()

# ----------------------------------------------------------------------------- per graded callable
# Each stage's Forbidden, what its graded callables may not call, is in its spec module
# (solutions/aNN_name/stage.py), built from the kinds above. A name one of them defines
# (GELU_KERNEL, MATMUL_KERNEL, ...) is importable from here too, as the tests import it.
def __getattr__(name: str):
    if name.isupper():
        from common.course import stages
        try:
            return getattr(stages, name)
        except AttributeError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- the check
@contextlib.contextmanager
def watch(forbid: Forbidden = NOTHING) -> Iterator[OpTrace]:
    """``with watch(forbid) as t: call()``: the dispatch trace (and, when ``forbid`` names
    functions, the function trace) that :func:`called` reads."""
    with trace_ops(functions=bool(forbid.functions)) as t:
        yield t


def op_matches(op: str, patterns: tuple[str, ...]) -> bool:
    """``op`` (as traced: "aten.exp_.default") is one of ``patterns`` (see :data:`TORCH_ARITH`)."""
    base = ".".join(op.split(".")[:2])               # "aten.exp_"
    for p in patterns:
        if p.endswith("*"):
            if op.startswith(p[:-1]):
                return True
        elif base == p or base == p + "_":
            return True
    return False


def called(trace: OpTrace, forbid: Forbidden) -> list[str]:
    """The forbidden aten ops and torch functions in ``trace``, sorted, each once."""
    return forbidden_ops(trace.ops, trace.functions, forbid)


def forbidden_ops(ops: list[str], functions: list[str], forbid: Forbidden) -> list[str]:
    """Which of the traced ``ops`` and ``functions`` ``forbid`` refuses, sorted, each once."""
    bad = {o for o in ops if forbid.ops and op_matches(o, forbid.ops)}
    return sorted(bad | {f for f in functions if f in forbid.functions})


def forbidden_kernels(kernels: list[str], forbid: Forbidden) -> list[str]:
    """Which GPU kernel names ``forbid`` refuses (substrings, any case; those matching ``forbid.allow`` pass)."""
    pats, allow = [p.lower() for p in forbid.kernels], [p.lower() for p in forbid.allow]
    return [k for k in kernels if any(p in k.lower() for p in pats) and not any(a in k.lower() for a in allow)]


def launched(call: Callable[[], object], forbid: Forbidden) -> list[str]:
    """On a GPU: the forbidden kernels one more call of ``call()`` launches (profiler); [] elsewhere."""
    if not (HAS_CUDA and forbid.kernels):
        return []
    return forbidden_kernels(profile(call, calls=1, warmup=0).kernels, forbid)


def ops_message(what: str, bad: list[str], use: str = "") -> str:
    """The error for forbidden ops; ``use`` (:attr:`Forbidden.use`): what the contract asks for instead."""
    bad = [b.replace("torch.nn.functional.", "F.") for b in bad]       # as a student writes it
    if use:
        return (f"{what}: called PyTorch ops {bad}, which its contract does not allow: use {use} (the grader "
                f"scores such a stage 0)")
    return (f"{what}: called PyTorch ops {bad} where the stage's kernel was asked for (the grader scores "
            f"such a stage 0: its numbers are right because PyTorch computed them)")


def kernels_message(what: str, bad: list[str]) -> str:
    return f"{what}: PyTorch/vendor kernels ran instead of the stage's: {bad[:3]}"


class NotAKernel(AssertionError):
    """The call ran the PyTorch op (or vendor kernel) that the stage replaces."""


def assert_is_kernel(call: Callable[[], object], forbid: Forbidden, what: str, *, kernels: bool = True):
    """Run ``call()`` once under the trace and return its result; raise :class:`NotAKernel`
    naming the ops if it called what ``forbid`` refuses. On a GPU (``kernels=True``) one more
    call runs under the profiler and is checked for forbidden kernels. Graded tests wrap the
    submission's calls with this; the grader's trials run the same checks."""
    __tracebackhide__ = True     # pytest: the test's line, then the submission's, not this wrapper
    with watch(forbid) as t:
        out = call()
    bad = called(t, forbid)
    if bad:
        raise NotAKernel(ops_message(what, bad, forbid.use))
    if kernels:
        bad = launched(call, forbid)
        if bad:
            raise NotAKernel(kernels_message(what, bad))
    return out


# ----------------------------------------------------------------------------- copies of inputs
def held_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a layer holds (parameters, buffers, tensor attributes), by name: what it must read
    in place on every call (:func:`input_copies`)."""
    held = {n: t for n, t in vars(module).items() if isinstance(t, torch.Tensor)}
    held.update(dict(module.named_parameters()))
    held.update(dict(module.named_buffers()))
    return {n.replace(".", "_"): t for n, t in held.items()}


class _Copies(TorchDispatchMode):
    def __init__(self, watched: dict[str, torch.Tensor], found: list[str]):
        super().__init__()
        self.watched, self.found = watched, found
        self.storages = {n: t.untyped_storage().data_ptr() for n, t in watched.items()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if not op_matches(name, TORCH_COPIES) or in_interpreted_kernel():
            return out
        sources = args[1:2] if name.startswith("aten.copy") else tree_leaves(args)
        read = dict.fromkeys(self.watched, 0)     # elements of each watched tensor this op read, over all its
        for src in sources:                      # arguments: torch.stack(w.unbind(0), 1) reads w row by row
            if not isinstance(src, torch.Tensor) or src.is_meta:
                continue
            ptr = src.untyped_storage().data_ptr()
            for n in self.watched:
                if ptr == self.storages[n]:
                    read[n] += src.numel()
        self.found += [f"'{n}' {list(t.shape)} by {name}" for n, t in self.watched.items()
                       if t.numel() and read[n] >= t.numel()]
        return out


def input_copies(call: Callable[[], object], **watched: torch.Tensor) -> tuple[object, list[str]]:
    """Run ``call()`` and return (its result, the copies it made of a ``watched`` tensor: a whole
    weight cloned, made contiguous, cast or concatenated; one line each). Views (``.t()``,
    ``.view``, ``.expand``) are not copies. Seen through the dispatcher, so on any device; the
    Triton interpreter's own argument copies are not the call's."""
    found: list[str] = []
    with _Copies({n: t for n, t in watched.items() if isinstance(t, torch.Tensor)}, found):
        out = call()
    return out, list(dict.fromkeys(found))


# ----------------------------------------------------------------------------- host syncs
#: Tensor methods that read a device value on the host: on a GPU each waits for the device (a sync),
#: and a CUDA graph cannot hold one (capture fails, or the value is baked in).
HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def host_syncs() -> Iterator[list[str]]:
    """``with host_syncs() as found: step()``: the host reads of tensor values ``step`` made
    (``.tolist()``, ``.item()``, ``.cpu()``, ``bool(t)``, ``int(t)``, a tensor as a Python index...),
    one line each with the tensor's shape. Works on the CPU too, where such a read costs nothing but
    on a GPU would synchronise; the Triton interpreter's own reads (running a kernel) are left out."""
    found: list[str] = []
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def wrap(name, fn):
        def seen(self, *args, **kwargs):
            if not in_interpreted_kernel():
                found.append(f"Tensor.{name}() on a tensor of shape {tuple(self.shape)}")
            return fn(self, *args, **kwargs)
        return seen
    for name, fn in saved.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield found
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


# ----------------------------------------------------------------------------- memory contracts
@dataclass
class NewTensor:
    """The largest tensor a call created: its storage in elements, the op and the shape."""
    elements: int = 0
    op: str = ""
    shape: tuple[int, ...] = ()


class _Largest(TorchDispatchMode):
    def __init__(self, given: set[int], found: NewTensor):
        super().__init__()
        self.given, self.found = given, found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.is_meta:
                continue
            st = t.untyped_storage()
            if st.data_ptr() in self.given or not st.nbytes():
                continue
            n = st.nbytes() // t.element_size()
            if n > self.found.elements:
                self.found.elements, self.found.op, self.found.shape = n, str(func), tuple(t.shape)
        return out


def largest_new_tensor(call: Callable[[], object], *given: torch.Tensor) -> tuple[object, NewTensor]:
    """Run ``call()`` and return (its result, the largest tensor it created). Tensors sharing
    storage with ``given`` (the inputs, views of them) are not new; views of a new tensor count
    as that tensor (its whole storage). Seen through the dispatcher, so on any device."""
    found = NewTensor()
    ids = {t.untyped_storage().data_ptr() for t in given if isinstance(t, torch.Tensor)}
    with _Largest(ids, found):
        out = call()
    return out, found


def attention_tile_bound(q: torch.Tensor, k: torch.Tensor, block_m: int, block_n: int) -> int:
    """Elements stage 7a may hold in one tensor: one [..., block_m, block_n] tile of scores, or
    an input/output-sized tensor ([..., N, d] for O, dQ, dK, dV), whichever is larger."""
    lead = q[..., 0, 0].numel()
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    return lead * max(min(block_m, nq) * min(block_n, nk), nq * d, nk * d)


def tile_message(what: str, found: NewTensor, bound: int, nq: int, nk: int) -> str:
    return (f"{what}: created a tensor of {found.elements} elements (shape {list(found.shape)}, by {found.op}); "
            f"one [block_m, block_n] tile of scores or an [N, d] tensor per head allows {bound}. "
            f"The score matrix is {nq}x{nk} per head: build it one tile at a time, never whole")
