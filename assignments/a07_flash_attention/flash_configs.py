"""Stage 7b's launch configurations (given code, imported by flash_triton.py).

Block sizes: a table per head dim (CONFIGS below) from a sweep on the H100 (`bench.py --sweep`),
and for 16-bit d = 128 a choice per length (HALF_D128, from the real-shape sweep); on a GPU with
less shared memory than a config needs (an RTX card's 99 KB, a T4's 64 KB; fp32 at d = 128 on any
GPU), the first of its smaller variants that fits (smaller_configs: fewer stages, then smaller
tiles); `with launch_options(tune=True):` autotunes instead, `fwd=` / `dkdv=` / `dq=` force one config,
`poison=True` NaN-fills the outputs first (tests); the interpreter uses small tiles.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import triton
from triton.runtime.errors import OutOfResources

from common import TRITON_INTERPRET
from common.launch import fast


def _configs(shapes):
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in shapes]


def _cfg(bm, bn, w, s):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}


#: Block configurations per kernel and head dim (d <= 64 / d = 128). On the GPU these are
#: the winners of `bench.py --sweep` on the H100 at S = 4096, bf16 (lectures/results/a07_sweep.log);
#: under the interpreter small tiles, since it is slow.
if TRITON_INTERPRET:
    from common.interpreter_patch import patch_bf16_dot
    patch_bf16_dot()   # triton 3.6's interpreter computes bf16 tl.dot wrongly without it
    CONFIGS = {"fwd": {64: _cfg(32, 16, 4, 1), 128: _cfg(32, 16, 4, 1)},
               "dkdv": {64: _cfg(16, 32, 4, 1), 128: _cfg(16, 32, 4, 1)},
               "dq": {64: _cfg(32, 16, 4, 1), 128: _cfg(32, 16, 4, 1)}}
else:
    CONFIGS = {"fwd": {64: _cfg(128, 64, 8, 3), 128: _cfg(128, 64, 8, 3)},
               "dkdv": {64: _cfg(32, 128, 4, 4), 128: _cfg(64, 128, 8, 3)},
               "dq": {64: _cfg(128, 64, 8, 3), 128: _cfg(128, 64, 8, 3)}}
#: 16-bit inputs at d = 128 on the GPU, before the table: (longest N_Q or None for any, config), the
#: first that fits the call wins. From the real-shape sweep's losing shapes (H100, each kernel timed
#: alone over a config grid: EXPERIMENTS.md, a07_shapes_try): dK/dV in 64x64 tiles,
#: 4 warps, 2 stages at every length (the table's 64x128 sits at 255 registers and spills when
#: causal; faster at short lengths, unchanged beyond the runs' spread at long ones); the forward in
#: 64x64 tiles, 4 warps, 3 stages up to 1024 queries (more, smaller programs: faster at S = 512, slower
#: than the table's 128x64 at 1000-2048 non-causal), 128x64 beyond (lectures/results/a07_real_shapes.md).
#: fp32 keeps the table (these tiles not measured).
HALF_D128 = {"fwd": [(1024, _cfg(64, 64, 4, 3))], "dkdv": [(None, _cfg(64, 64, 4, 2))]}
_KEY = ["N_Q", "N_K", "HEAD_DIM", "CAUSAL"]
FWD_TUNE = _configs([(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (64, 64, 4, 4)])
DKDV_TUNE = _configs([(32, 128, 4, 4), (64, 128, 8, 3), (32, 64, 4, 4), (64, 64, 4, 3)])
DQ_TUNE = _configs([(128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 4), (128, 32, 4, 4)])
_tuned = {}


@dataclass(frozen=True)
class LaunchOptions:
    """How the kernels are launched (given code; set with ``launch_options``).

    tune: triton.autotune over the *_TUNE sets instead of CONFIGS (bench.py --tune; compiles
    every config). fwd / dkdv / dq: one config dict (BLOCK_M, BLOCK_N, num_warps, num_stages)
    forced for every head dim (bench.py --sweep). poison: fill the outputs with NaN before the
    kernels run, so that an unwritten element can never pass for a right one (the tests)."""
    tune: bool = False
    fwd: dict | None = None
    dkdv: dict | None = None
    dq: dict | None = None
    poison: bool = False


_options = [LaunchOptions()]   # a stack; only launch_options changes it (backward may run on another thread)


@contextlib.contextmanager
def launch_options(**options):
    """``with launch_options(tune=True):`` / ``(fwd={...})`` / ``(poison=True)``: the calls inside
    launch that way (``LaunchOptions``), backward passes included; as before after the block. (The
    backward of a forward replayed from C++ before the block, common.course.native, replays as it was recorded.)"""
    _options.append(LaunchOptions(**options))
    try:
        yield _options[-1]
    finally:
        _options.pop()


def _pick(kind: str, d: int, n: int, dtype: torch.dtype) -> dict:
    """The block config of kernel ``kind`` ("fwd", "dkdv", "dq") at head dim d, N_Q = n and dtype: HALF_D128's
    choice for 16-bit d = 128 on a GPU, else the table's (CONFIGS)."""
    if d > 64 and dtype.itemsize == 2 and not TRITON_INTERPRET:
        for longest, cfg in HALF_D128.get(kind, []):
            if longest is None or n <= longest:
                return cfg
    return CONFIGS[kind][64 if d <= 64 else 128]


def smaller_configs(cfg: dict) -> Iterator[dict]:
    """``cfg``, then what a launch falls back to, in this order, on a GPU whose shared memory it does not
    fit (Triton's OutOfResources at the launch): the same tiles with one stage fewer, down to two; then
    the larger tile side halved (at most 4 warps and 2 stages from there), down to 16 x 16, and that
    with one stage. On the H100 every 16-bit config of the tables fits as it is; tests/test_portability.py
    compiles what each GPU family ends up with (common.course.portability)."""
    bm, bn, w, s = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]
    while True:
        last = max(bm, bn) <= 16
        for stages in range(s, 0 if last else min(s, 2) - 1, -1):
            yield _cfg(bm, bn, w, stages)
        if last:
            return
        if bn >= bm:
            bn //= 2
        else:
            bm //= 2
        w, s = min(w, 4), min(s, 2)


def _kernel(fn, kind: str, d: int, n: int, dtype: torch.dtype):
    """(kernel, launch kwargs, may fall back) for one of the three tiled kernels, at head dim d and N_Q = n."""
    opts = _options[-1]
    if opts.tune:
        if fn not in _tuned:
            tune = {"fwd": FWD_TUNE, "dkdv": DKDV_TUNE, "dq": DQ_TUNE}[kind]
            _tuned[fn] = triton.autotune(tune, key=_KEY)(fn)
        return _tuned[fn], {}, False   # the autotuner skips configs that do not fit by itself
    forced = getattr(opts, kind)
    if forced:
        return fn, dict(forced), False
    return fn, dict(_pick(kind, d, n, dtype)), True


#: (kernel, launch kwargs) that did not fit this GPU's shared memory -> the kwargs that run instead
_smaller: dict[tuple, dict] = {}


def _launch(kernel, grid, args: tuple, kwargs: dict, fallback: bool, prepared=None) -> None:
    """``kernel[grid](*args, **kwargs)``, or ``prepared(*args)`` (a plan's common.launch.Prepared of them);
    where the config does not fit the GPU's shared memory and ``fallback``, the first of smaller_configs
    that does (remembered: later calls launch it directly)."""
    if _smaller:                     # empty on a GPU where every config fits (the H100's 16-bit tables)
        smaller = _smaller.get((kernel, tuple(kwargs.items())))
        if smaller is not None:      # this launch fell back: the smaller config, through the launcher
            kwargs, prepared = smaller, None
    try:
        if prepared is not None:
            prepared(*args)
        else:
            fast(kernel)[grid](*args, **kwargs)
        return
    except OutOfResources:
        if not fallback:
            raise
    names = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
    rest = {k: v for k, v in kwargs.items() if k not in names}
    for cfg in list(smaller_configs({k: kwargs[k] for k in names}))[1:]:
        try:
            fast(kernel)[grid](*args, **rest, **cfg)
        except OutOfResources:
            continue
        _smaller[(kernel, tuple(kwargs.items()))] = {**rest, **cfg}
        return
    raise OutOfResources(0, 0, f"shared memory: no config of {kernel.__name__} down to 16x16 tiles fits this GPU")
