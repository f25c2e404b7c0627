"""Building CUDA extensions once, and checking CUDA sources without a GPU.

* :func:`load_op` builds ``.cu``/``.cpp`` sources with
  ``torch.utils.cpp_extension.load`` into a cache folder (``$TORCH_EXTENSIONS_DIR``,
  default ``~/.cache/gpu-kernels-course``). The first build of an op takes a minute
  and says so; later calls, in this process or the next, reuse the build. Editing a
  source changes its hash, so the next process rebuilds the op (a running process keeps
  the op it loaded: its operators are registered).
* :func:`compile_check` runs ``nvcc`` (kernels) and the host compiler (bindings,
  with the torch headers) as a syntax and type check. It needs no GPU, so CI can
  catch a broken kernel file on a CPU-only machine.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

#: Ops loaded in this process: (name, namespace, sources, flags) -> build name. A loaded
#: extension cannot be replaced in a running process (its operators are registered), so
#: later calls skip hashing the sources: wrappers may call load_op on every call.
_LOADED: dict[tuple, str] = {}
#: Target used by compile_check (no GPU to ask): Hopper. load_op targets the GPU present.
CHECK_ARCH = "sm_90a"


def cache_dir() -> Path:
    d = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "gpu-kernels-course"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _digest(sources: Sequence[Path], flags: Sequence[str]) -> str:
    h = hashlib.sha1()
    for s in sources:
        h.update(Path(s).read_bytes())
    h.update(" ".join(flags).encode())
    return h.hexdigest()[:12]


def build_folder(name: str, sources: Sequence[Path], flags: Sequence[str]) -> tuple[str, Path, bool]:
    """(build name, its folder in the cache, True if no build is there yet) of ``sources`` built with
    ``flags``: the name carries a hash of both, so an edit builds anew."""
    build_name = f"{name}_{_digest(sources, flags)}"
    build_dir = cache_dir() / build_name
    build_dir.mkdir(parents=True, exist_ok=True)
    return build_name, build_dir, not any(build_dir.glob("*.so"))


#: Extra ``-D`` defines for every course CUDA build, e.g. ``COURSE_CUDA_DEFINES=A07C_DEBUG_HANG``
#: (space- or comma-separated): a kernel's debug or experiment variant, which its source documents.
#: A variant builds and caches apart (the defines are in the build's name); one process loads one.
DEFINES_VAR = "COURSE_CUDA_DEFINES"


#: Headers the course's CUDA sources share (``#include "hopper.cuh"``): on every build's include path.
INCLUDE = Path(__file__).resolve().parent


def load_op(name: str, sources: Sequence[str | Path], *, namespace: str, op_name: str | None = None,
            extra_cuda_cflags: Sequence[str] = (), fast_math: bool = False, verbose: bool = False) -> str:
    """Build (or reuse) an extension that registers torch operators; return its build name.

    The sources register their ops with ``TORCH_LIBRARY(COURSE_NS, m)`` through the
    indirection ``#define COURSE_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)`` (so the macro
    ``COURSE_NS`` is expanded); ``namespace`` is passed as ``-DCOURSE_NS=<namespace>``
    (use ``common.impl.op_namespace(__name__)``). Call the ops as
    ``getattr(torch.ops, namespace).<op>``. ``op_name``, for sources that register one op
    under a name the caller chooses, is passed as ``-DCOURSE_OP_NAME=<op_name>`` (stage 4:
    ``fused_gelu`` or, for the ``fast_math`` (``--use_fast_math``) build, ``fused_gelu_fast``).
    ``COURSE_CUDA_DEFINES`` (:data:`DEFINES_VAR`) adds defines to every build.
    Raises RuntimeError without a CUDA GPU.
    """
    variant = tuple(f"-D{d}" for d in os.environ.get(DEFINES_VAR, "").replace(",", " ").split())
    extra_cuda_cflags = (*extra_cuda_cflags, *variant)
    key = (name, namespace, op_name, tuple(map(str, sources)), tuple(extra_cuda_cflags), fast_math)
    if key in _LOADED:
        return _LOADED[key]
    import torch
    from torch.utils.cpp_extension import load
    if not torch.cuda.is_available():
        raise RuntimeError(f"{name}: building and running a CUDA op needs a CUDA GPU "
                           "(on a CPU-only machine use compile_check to check the sources)")
    sources = [Path(s) for s in sources]
    defines = [f"-DCOURSE_NS={namespace}"] + ([f"-DCOURSE_OP_NAME={op_name}"] if op_name else [])
    # Hidden symbols: torch loads extensions RTLD_GLOBAL, so two builds of one stage in a process (the
    # solutions and a submission, or two mutants) would otherwise share C++ symbols such as
    # launch_matmul or a template's instance, and the second would call the first's code. The op
    # registration (TORCH_LIBRARY) needs no exported symbol.
    hidden = ["-fvisibility=hidden", "-fvisibility-inlines-hidden"]
    flags = ["-O3", "-lineinfo", "--expt-relaxed-constexpr", "-std=c++17", *defines,
             *(f"-Xcompiler={h}" for h in hidden), *extra_cuda_cflags]
    if fast_math:
        flags.append("--use_fast_math")
    build_name, build_dir, fresh = build_folder(name, sources, flags)
    if fresh:
        print(f"[course] building CUDA op {name} (first build takes about a minute; cached in {build_dir})",
              file=sys.stderr, flush=True)
    load(name=build_name, sources=[str(s) for s in sources], extra_cuda_cflags=flags, extra_include_paths=[str(INCLUDE)],
         extra_cflags=["-O3", "-std=c++17", *defines, *hidden], build_directory=str(build_dir),
         is_python_module=False, verbose=verbose)
    _LOADED[key] = build_name
    return build_name


class CourseOp(NamedTuple):
    """One CUDA extension the course builds: the module that builds it (for common.impl.load), how,
    the test file that needs it (tests/autograder.py prebuilds it when that file is selected), and
    whether it exists for sm_90 GPUs only."""
    module: str
    build: Callable[[ModuleType], object]
    tests: str
    hopper_only: bool = False


def course_ops() -> dict[str, CourseOp]:
    """The CUDA extensions the course builds, by name: each stage's ``cuda_ops()`` (its spec module,
    solutions/aNN_name/stage.py, found by common.course.stages), e.g. stage 4's op and its --use_fast_math twin."""
    from common.course.stages import STAGE_MODULES
    return {name: op for m in STAGE_MODULES if hasattr(m, "cuda_ops") for name, op in m.cuda_ops().items()}


def __getattr__(name: str):
    if name == "COURSE_OPS":                   # course_ops() as a table
        return course_ops()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def course_ops_here(test_files: Collection[str] | None = None) -> list[str]:
    """The names of course_ops() this GPU can run (sm_90 ones on sm_90 only), restricted to those that
    ``test_files`` (file names in tests/) need when given."""
    from common import is_hopper
    return [n for n, op in course_ops().items()
            if (not op.hopper_only or is_hopper()) and (test_files is None or op.tests in test_files)]


def build_course_ops(impl: str | None = None, names: Sequence[str] | None = None) -> None:
    """Build the CUDA extensions ``names`` (keys of course_ops(); default: course_ops_here()) of
    ``impl`` (default: $COURSE_IMPL, else assignments) one after the other, on a GPU machine."""
    import time

    from common.impl import load
    ops = course_ops()
    for name in course_ops_here() if names is None else names:
        t0 = time.time()
        op = ops[name]
        op.build(load(op.module, impl))
        print(f"[build] {name} of {impl or 'the current impl'} ready in {time.time() - t0:.0f} s", flush=True)


def prebuild(names: Sequence[str], impl: str | None = None) -> list[subprocess.Popen]:
    """Start one background process per extension in ``names`` that builds it into the cache (a GPU
    machine; ``[]`` elsewhere). A cold test run then compiles the extensions side by side while
    the first tests run, instead of one after the other when a test first needs each: a test that
    loads an op still building waits for it (torch's build lock), then loads the cached build. A
    build that fails there fails again in the test that needs it, with the compiler's message.
    Each process's output: ``<cache_dir>/prebuild-<name>.log``."""
    import torch
    if not torch.cuda.is_available():
        return []
    env = dict(os.environ, **({"COURSE_IMPL": str(impl)} if impl is not None else {}))
    root = Path(__file__).resolve().parent.parent
    procs = []
    for name in names:
        with open(cache_dir() / f"prebuild-{name}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", f"from common.cuda_ext import build_course_ops; build_course_ops(names=[{name!r}])"],
                cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    return procs


def nvcc_path() -> str | None:
    cand = shutil.which("nvcc") or (os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
                                     if os.environ.get("CUDA_HOME") else None)
    return cand if cand and os.path.exists(cand) else None


def _torch_includes() -> list[str]:
    from torch.utils.cpp_extension import include_paths
    return include_paths()


def _cuda_include() -> list[str]:
    nvcc = nvcc_path()
    if not nvcc:
        return []
    # nvcc's own folder first; then CUDA_HOME and /usr/local/cuda (nvcc may be a wrapper script).
    roots = [Path(nvcc).resolve().parent.parent, Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")),
             Path("/usr/local/cuda")]
    for root in roots:
        if (root / "include" / "cuda_runtime_api.h").exists():
            return [str(root / "include")]
    return []


def compile_check(sources: Sequence[str | Path], *, extra_flags: Sequence[str] = ("-DCOURSE_NS=course_check",),
                  archs: Sequence[str] = (CHECK_ARCH,)) -> None:
    """Compile each source as a syntax/type check (no linking, no GPU needed).

    ``.cu`` files go through ``nvcc -c`` for each of ``archs`` (default CHECK_ARCH; e.g. ``("sm_75",
    "sm_80", "sm_86", "sm_89")``: what the extension builds for on those GPUs, in one nvcc call);
    ``.cpp`` files through the host compiler with the torch and CUDA headers. Raises RuntimeError
    with the compiler's output when a source does not compile.
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError("nvcc not found (install the CUDA toolkit or set CUDA_HOME)")
    incs = [f"-I{p}" for p in _torch_includes() + _cuda_include() + [str(INCLUDE)]]
    incs.append(f"-I{sysconfig.get_paths()['include']}")
    for src in map(Path, sources):
        if src.suffix == ".cu":
            targets = [f"-arch={archs[0]}"] if len(archs) == 1 else \
                [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
            cmd = [nvcc, "-c", str(src), "-o", os.devnull, "-std=c++17", *targets,
                   "--expt-relaxed-constexpr", *incs, *extra_flags]
        else:
            cxx = os.environ.get("CXX", "c++")
            cmd = [cxx, "-fsyntax-only", "-std=c++17", str(src), *incs, *extra_flags]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{src.name} does not compile:\n{r.stdout}{r.stderr}")
