"""Cheap host work around a kernel launch (lecture 3, "Host overhead"; ``python -m common.course.hostcost``).

At small shapes an eager call costs what the host spends on it, and a wrapper's Python can
cost more than the launch itself. Four habits keep it small:

* integer helpers in plain Python: ``triton.cdiv`` and ``triton.next_power_of_2`` are
  ``@constexpr_function`` objects in Triton 3.x, about a microsecond or more per call from
  Python; :func:`cdiv` and :func:`next_power_of_2` here are one integer expression each;
* decisions per key: what a call derives from its shapes, strides and dtypes (the grid, a
  config, which path) is computed once per key and looked up after that (a dict, or
  ``functools.lru_cache`` on a function of the key);
* one registered-op dispatch only where it is needed: :func:`plain_eager` says when a call
  may run a custom op's body directly (plain tensors, nothing tracing, no autograd), and the
  op keeps its registration for ``torch.compile``, fake tensors and traces;
* a launch that asks only what can change: :func:`fast` (``fast(kernel)[grid](...)``) and a plan's
  :class:`Prepared` launch skip Triton's binder once a call like it has been made, and pass the
  tensors' addresses as integers.
"""
from __future__ import annotations

from functools import partial

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b (what ``triton.cdiv`` computes, without its call overhead)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n (1 for n = 1; 0 for n = 0, as ``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def plain_eager(*tensors: torch.Tensor) -> bool:
    """True when a custom op's body may run directly instead of through the dispatcher: every
    tensor a plain ``torch.Tensor`` (no FakeTensor, no subclass) that needs no gradient, no
    dispatch mode active (fake tensors, the course's traces) and torch.compile not tracing.
    Otherwise call the registered op, which handles all of those."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    grad = torch.is_grad_enabled()
    return all(type(t) is torch.Tensor and not (grad and t.requires_grad) for t in tensors)


class Launcher:
    """``Launcher(kernel)[grid](*args, **kwargs)`` launches exactly what ``kernel[grid](*args, **kwargs)``
    launches, with Triton's per-call Python done once per key.

    ``kernel[grid](...)`` spends host time before the driver sees the launch (lecture 3, "Host overhead";
    lectures/results/hostcost.md): it
    reads the current device and stream, binds and specialises the arguments, builds the cache key
    (a string), looks the compiled kernel up, checks the kernel's globals and builds launch
    metadata. Only the binding depends on the call: Triton's own binder (native code) gives each
    argument's specialisation (dtype, 16-byte alignment, integers equal to 1 or divisible by 16,
    constexpr values) and the options (``num_warps``, ...). Here that specialisation, with the
    device and the options, is the key of a dict of compiled kernels; a hit goes straight to the
    compiled kernel's launcher (``CompiledKernel.run``, or the native function behind it). A miss,
    the interpreter, a launch hook (a profiler such as proton) or an autotuner goes through
    ``kernel[grid]`` as usual, so a call never launches a kernel compiled for other arguments. It
    relies on Triton's internals: with a release other than :data:`FAST_TRITON` every launch takes
    ``kernel[grid]``.
    """

    __slots__ = ("kernel", "_cache", "_device", "_binder", "_prepared")

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._prepared: dict = {}    # (grid, *kwargs items) -> Prepared: run's launches of plain-kind calls
        self._cache: dict = {}       # (device, specialisation, options, debug, instrumentation) -> CompiledKernel
        self._device = -1            # the device of the last launch, and Triton's binder there
        self._binder = None

    def __getitem__(self, grid):
        return partial(self.run, grid)

    def prepare(self, grid, **kwargs) -> Prepared:
        """A :class:`Prepared` launch of this kernel: ``grid`` and the constexprs and options fixed."""
        return Prepared(self, grid, kwargs)

    def run(self, grid, *args, **kwargs):
        """``kernel[grid](*args, **kwargs)``; returns the compiled kernel, as Triton does.

        A grid of integers with constexprs and options of plain kinds (int, bool, str, float, None) is a
        :class:`Prepared` launch's key: a call like one before it (the same grid, constexprs and options,
        and integers, each tensor's dtype and alignment as a call before) skips Triton's binder. So a
        student's ``fast(kernel)[grid](...)`` costs about what a plan's prepared launch costs."""
        if self._binder is not None and type(grid) is tuple:
            try:
                key = (grid, *kwargs.items(), *map(type, kwargs.values()))   # typed: 1, 1.0 and True are equal
                prepared = self._prepared.get(key)
            except TypeError:                  # an unhashable grid or constexpr
                return self._run(grid, *args, **kwargs)
            if prepared is None:
                if len(self._prepared) >= MAX_PREPARED or not all(type(v) in _PLAIN for v in kwargs.values()):
                    return self._run(grid, *args, **kwargs)   # full, or a tensor given by name
                prepared = self._prepared[key] = Prepared(self, grid, kwargs)
            return prepared(*args)
        return self._run(grid, *args, **kwargs)

    def _run(self, grid, *args, **kwargs):
        """:meth:`run` without the prepared launches: Triton's binder, then this launcher's key."""
        device = torch._C._cuda_getDevice() if self._binder is not None else None
        if device != self._device or _hooked():
            return self._first(grid, args, kwargs)
        bound, spec, options = self._binder(*args, **kwargs)
        key = (device, tuple(spec), tuple(options.items()), _RT.debug, _COMPILATION.instrumentation_mode)
        try:
            hit = self._cache.get(key)
        except TypeError:                      # an unhashable constexpr: Triton's own path
            return self.kernel[grid](*args, **kwargs)
        if hit is None:                        # a new key: compile (or find) it the usual way
            ck = self.kernel[grid](*args, **kwargs)
            if ck is not None and not hasattr(ck, "result"):
                self._cache[key] = (ck, _direct(ck))
            return ck
        ck, direct = hit
        if callable(grid):
            grid = grid(bound)
        n = len(grid)
        g0, g1, g2, stream = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, _raw_stream(device)
        if direct is None:
            ck.run(g0, g1, g2, stream, ck.function, ck.packed_metadata, None, None, None, *bound.values())
        else:                                  # the launcher's native call (no scratch to allocate)
            direct[0](g0, g1, g2, stream, ck.function, direct[1], direct[2], None, None, ck.packed_metadata,
                      None, None, None, *bound.values())
        return ck

    def _first(self, grid, args: tuple, kwargs: dict):
        """A launch through ``kernel[grid]``; on a GPU, the device's binder is kept for the fast path
        (with the Triton release this was written against only: see FAST_TRITON)."""
        out = self.kernel[grid](*args, **kwargs)
        if not _FAST:
            return out
        caches = getattr(self.kernel, "device_caches", None)   # a JITFunction's (not the interpreter's)
        if caches and torch.cuda.is_available():
            device = torch._C._cuda_getDevice()
            entry = caches.get(device)
            if isinstance(entry, tuple) and len(entry) == 5 and callable(entry[4]):
                self._device, self._binder = device, entry[4]
        return out


class Prepared:
    """``fast(kernel).prepare(grid, **kwargs)``: the launch of one wrapper plan, called as ``prepared(*args)``.

    A course wrapper keys its plan on its inputs' metadata (shapes, strides, dtypes, devices: lecture 3,
    "Host overhead"), so that calls with one key pass the same integers and constexprs, and differ only
    in their tensors' addresses. Triton specialises a launch on exactly these: each integer (equal to 1?
    a multiple of 16? its width), each tensor's dtype and 16-byte alignment, the constexprs and options.
    So, past a plan's first call, this skips Triton's binder and the launcher's key (about half of what a
    27-argument gemv launch costs through :class:`Launcher`: lectures/results/hostcost.md) and asks only
    what can change: the current device, the launch hooks, Triton's debug and instrumentation knobs
    (the launcher's key has them), each tensor's dtype, 16-byte alignment and
    that it is on the GPU, and the integers (floats are not specialised). A launch made before for the
    same answers is reused (at most MAX_PREPARED of them); any other call goes through :class:`Launcher`
    (correct, as slow as before) and is remembered for the next. The launch takes each tensor's address
    as an integer: given a tensor, the native launch calls its ``data_ptr()`` and asks the driver about
    the pointer (a share of a 27-argument launch: lectures/results/hostcost.md). A tensor passed at several
    positions (a wrapper's placeholder for unused pointers) is asked about once, while later calls pass
    it the same way. ``args`` are the kernel's runtime arguments in its order, positionally; the
    constexprs and options go in ``kwargs`` once, here. Under the interpreter, or with a Triton release
    other than FAST_TRITON, every call goes through the launcher.
    """

    __slots__ = ("launcher", "grid", "kwargs", "ready", "device", "debug", "instrumentation", "tensor_at", "same_at",
                 "fixed_at", "tail", "kernels")

    def __init__(self, launcher: Launcher, grid, kwargs: dict) -> None:
        self.launcher, self.grid, self.kwargs = launcher, grid, kwargs
        self.ready = False
        self.kernels: dict = {}        # (the integers, *each tensor's (dtype, 16-byte aligned)) -> (compiled kernel,
                                       # native launch, grid)

    def __call__(self, *args):
        if self.ready and torch._C._cuda_getDevice() == self.device and not _hooked() \
                and _RT.debug == self.debug and _COMPILATION.instrumentation_mode == self.instrumentation:
            try:
                a = list(args)
                key = [tuple([a[i] for i in self.fixed_at])]
                for i in self.tensor_at:       # each tensor's address goes to the launch as an integer: the
                    t = a[i]                   # native launch then skips its data_ptr() and a driver query
                    ptr = a[i] = t.data_ptr()
                    key.append((t.dtype, ptr & 15 == 0, t.is_cuda))
                for i, j in self.same_at:      # one tensor passed again (a wrapper's placeholder for an unused
                    if args[i] is not args[j]:     # pointer): asked once, as the first call passed it
                        raise TypeError
                    a[i] = a[j]
                hit = self.kernels.get(tuple(key))
            except (AttributeError, IndexError, RuntimeError, TypeError):   # not the arguments of the first call
                hit = None
            if hit is not None:
                ck, direct, g = hit
                try:
                    direct[0](g[0], g[1], g[2], _raw_stream(self.device), ck.function, direct[1], direct[2], None,
                              None, ck.packed_metadata, None, None, None, *a, *self.tail)
                    return ck
                except TypeError:      # a float equal to the first call's int (1.0 == 1): not that kernel's call
                    pass               # (the native launch parses its arguments before it launches anything)
        return self._through_launcher(args)

    def _key(self, args: tuple) -> tuple:
        """The kernels' key of a call (what ``__call__`` builds inline, where it also swaps in the addresses)."""
        return (tuple([args[i] for i in self.fixed_at]),
                *[(args[i].dtype, args[i].data_ptr() & 15 == 0, args[i].is_cuda) for i in self.tensor_at])

    def compiled(self, *args):
        """(compiled kernel, grid) that a call with ``args`` launches without the launcher, or None (no such
        call made yet). :mod:`common.course.native` records a plan's launches from it."""
        if not self.ready or _RT.debug != self.debug or _COMPILATION.instrumentation_mode != self.instrumentation:
            return None
        try:
            if any(args[i] is not args[j] for i, j in self.same_at):
                return None
            hit = self.kernels.get(self._key(args))
        except (AttributeError, IndexError, RuntimeError, TypeError):
            return None
        return None if hit is None else (hit[0], hit[2])

    def _through_launcher(self, args: tuple):
        """The launch through :class:`Launcher`; then, where it can, what a later call needs to skip it."""
        launcher = self.launcher
        ck = launcher._run(self.grid, *args, **self.kwargs)
        binder = launcher._binder
        if binder is None or ck is None or hasattr(ck, "result") or _hooked() or len(self.kernels) >= MAX_PREPARED:
            return ck
        direct = _direct(ck)
        if direct is None:
            return ck
        bound, spec, _ = binder(*args, **self.kwargs)
        values = list(bound.values())
        n = len(args)
        if len(values) < n or any(v is not a for v, a in zip(values, args)):
            return ck                  # the arguments are not the kernel's first n, in order: no shortcut
        if not self.ready:
            tensor_at, same_at, fixed_at, first = [], [], [], {}
            for i, (a, sp) in enumerate(zip(args, spec)):
                if isinstance(a, torch.Tensor):
                    if id(a) in first:
                        same_at.append((i, first[id(a)]))
                    else:
                        first[id(a)] = i
                        tensor_at.append(i)
                elif not (isinstance(a, float) and sp[1] is None):   # a float Triton does not specialise: free
                    fixed_at.append(i)
            self.tensor_at, self.same_at, self.fixed_at = tensor_at, same_at, fixed_at
            self.tail = tuple(values[n:])
            self.device = launcher._device
            self.debug, self.instrumentation = _RT.debug, _COMPILATION.instrumentation_mode   # compiled with
            self.ready = True
        elif launcher._device != self.device or _RT.debug != self.debug \
                or _COMPILATION.instrumentation_mode != self.instrumentation \
                or any(isinstance(args[i], torch.Tensor) for i in self.fixed_at) \
                or not all(isinstance(args[i], torch.Tensor) for i in self.tensor_at) \
                or any(args[i] is not args[j] for i, j in self.same_at):
            return ck                  # a call this plan was not made for: it keeps going through the launcher
        g = self.grid(bound) if callable(self.grid) else self.grid
        g = (*g, 1, 1)[:3]
        try:
            key = self._key(args)
            if key not in self.kernels:    # kept: an equal key of another kind (1.0 after 1) stays on the launcher
                self.kernels[key] = (ck, direct, g)
        except TypeError:                  # an argument that cannot be a key
            pass
        return ck


def fast(kernel) -> Launcher:
    """The :class:`Launcher` of ``kernel``: ``fast(kernel)[grid](*args, **kwargs)`` is
    ``kernel[grid](*args, **kwargs)`` at a fraction of its host cost per launch (a grid of integers: a
    :class:`Prepared` launch, about a bare Triton launch's cost for a 9-argument kernel on the H100;
    lecture 3, §7). The launcher lives on the kernel object (one per kernel, made on its first use),
    not in this module."""
    try:
        return kernel._course_launcher
    except AttributeError:
        launcher = kernel._course_launcher = Launcher(kernel)
        return launcher


def _direct(ck):
    """(native launch function, cooperative grid, PDL) of a compiled kernel whose launcher allocates no
    scratch memory (Triton 3.6's CudaLauncher: its ``__call__`` then only forwards to the native
    function), else None: such a kernel is launched through ``ck.run``."""
    r = ck.run
    if getattr(r, "global_scratch_size", 1) == 0 and getattr(r, "profile_scratch_size", 1) == 0 \
            and callable(getattr(r, "launch", None)):
        return r.launch, r.launch_cooperative_grid, r.launch_pdl
    return None


def _hooked() -> bool:
    """True while a launch hook is set (Triton 3.6 keeps them in a HookChain, empty by default)."""
    try:
        return bool(_RT.launch_enter_hook.calls or _RT.launch_exit_hook.calls)
    except AttributeError:               # a hook set as a plain function (or None)
        return _RT.launch_enter_hook is not None or _RT.launch_exit_hook is not None


#: At most this many prepared launches a launcher makes for run's calls, and kernels a prepared launch keeps
#: (a grid that follows a varying length would otherwise grow them without end); past it, the launcher's path.
MAX_PREPARED = 64

#: The kinds of constexpr and option values a launcher's run keys a prepared launch on.
_PLAIN = frozenset((int, bool, str, float, type(None)))

#: The Triton release whose launcher internals :class:`Launcher` relies on (the binder's results, the
#: device cache's layout, ``CompiledKernel.run``'s arguments, the CUDA launcher's attributes): tested
#: on the H100 with 3.6. Under any other release every launch goes through ``kernel[grid]``, correct
#: and as slow as Triton's own launcher.
FAST_TRITON = (3, 6)

try:
    import triton as _triton
    from triton import knobs as _knobs
    _RT, _COMPILATION = _knobs.runtime, _knobs.compilation
    _FAST = tuple(int(p) for p in _triton.__version__.split(".")[:2]) == FAST_TRITON
except (ImportError, ValueError):  # no Triton (it installs on Linux only), an older one, or an odd version string
    _RT = _COMPILATION = None
    _FAST = False
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
