"""One stage's trials and (on a GPU) its timing, in a subprocess of its own.

    python -m common.grade.worker a03 --impl solutions

prints one line, :data:`MARK` followed by the :class:`WorkerResult` as JSON, which
``run.py`` reads back (:meth:`WorkerResult.from_json`). A submission that crashes or hangs
here takes only this process with it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import traceback
from dataclasses import replace

from .result import WorkerResult
from .score import FAIL, NEEDS_GPU, PASS, combined_speedup

#: the line of the worker's stdout that carries its result
MARK = "@@GRADE-RESULT@@"


# =============================================================================== the trials
@contextlib.contextmanager
def _poison_empty():
    """torch.empty & co. return NaN (ints: their max) while this is on, so an output
    buffer the submission never writes is recognisable: see :func:`_unwritten`."""
    import warnings

    import torch
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)     # warn_only: no op is refused
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def _unwritten(outs) -> bool:
    """Every element of some non-empty output is still the poison: NaN, or an integer's max."""
    import torch
    for o in outs:
        if not isinstance(o, torch.Tensor) or not o.numel():
            continue
        if o.is_floating_point() or o.is_complex():
            if bool(torch.isnan(o).all()):
                return True
        elif o.dtype != torch.bool and bool((o == torch.iinfo(o.dtype).max).all()):
            return True
    return False


def run_stage(impl: str, stage_key: str) -> WorkerResult:
    """The grader's trials and (GPU) the performance case of one stage, in this process."""
    from common import HAS_CUDA, guard, kernel_check
    from common.impl import load as load_impl
    from common.profiling import profile
    from common.stages import NeedsGPU, by_key, perf_cases, tensors
    from common.testing import rel_error

    stage = by_key(stage_key)
    res = WorkerResult()
    before = guard.snapshot()

    def load(module):
        return load_impl(module, impl)

    rng = random.SystemRandom()
    try:
        trials = stage.trials(load, rng)
    except NeedsGPU as e:
        res.correctness = NEEDS_GPU
        res.message = str(e)
        return res
    except NotImplementedError as e:
        res.correctness = FAIL
        res.not_implemented.append(f"NotImplementedError: {e}")
        res.message = f"setting up trials failed: NotImplementedError: {e}"
        return res
    except Exception as e:  # noqa: BLE001 - a broken submission fails its stage with the message
        res.correctness = FAIL
        res.message = f"setting up trials failed: {type(e).__name__}: {e}"
        return res
    patched = guard.changed(before)
    if patched:
        res.violations.append(f"the submission patched {', '.join(patched)} at import")
    res.trials_total = len(trials)
    worst_ratio, msgs = -1.0, []
    for tr in trials:
        try:
            with _poison_empty(), kernel_check.watch(tr.forbid) as t:
                out = tr.call()
            bad_ops = kernel_check.called(t, tr.forbid)
            if bad_ops:
                res.violations.append(kernel_check.ops_message(tr.name, bad_ops))
                continue
            outs, refs = tensors(out), tensors(tr.ref)
            if len(outs) != len(refs):
                msgs.append(f"{tr.name}: returned {len(outs)} tensors, expected {len(refs)}")
                continue
            if not tr.exact and _unwritten(outs):
                note = f"{tr.name}: the output was never written (still NaN)"
                res.not_implemented.append(note)
                msgs.append(note)
                continue
            if tr.exact:
                ok = all(o.tolist() == r.tolist() for o, r in zip(outs, refs))
                err = 0.0 if ok else float("inf")
                if not ok:
                    msgs.append(f"{tr.name}: got {[o.tolist() for o in outs]}, expected {[r.tolist() for r in refs]}")
            else:
                scales = tensors(tr.scale) if tr.scale is not None else [None] * len(refs)
                err = max(rel_error(o, r, sc) for o, r, sc in zip(outs, refs, scales))
                ok = err <= tr.tol
                if not ok:
                    msgs.append(f"{tr.name}: relative error {err:.3e} > tolerance {tr.tol:.1e}")
            ratio = err / tr.tol if tr.tol else (0.0 if ok else float("inf"))
            if ratio > worst_ratio:
                worst_ratio, res.worst_error, res.tolerance = ratio, err, tr.tol
            if ok:
                bad = kernel_check.launched(tr.call, tr.forbid)       # on a GPU: the profiler
                if bad:
                    res.violations.append(kernel_check.kernels_message(tr.name, bad))
                    continue
            res.trials_passed += int(ok)
        except NeedsGPU as e:
            msgs.append(f"{tr.name}: needs a GPU ({e})")
        except NotImplementedError as e:
            note = f"NotImplementedError: {e}"
            if note not in res.not_implemented:
                res.not_implemented.append(note)
            msgs.append(f"{tr.name}: {note}")
        except Exception as e:  # noqa: BLE001
            msgs.append(f"{tr.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    patched = guard.changed(before)
    if patched:
        res.violations.append(f"the submission patched {', '.join(patched)}")
    res.correctness = PASS if res.trials_passed == res.trials_total and not res.violations else FAIL
    res.message = "; ".join(msgs[:3])
    if res.worst_error is not None and res.worst_error == float("inf"):
        res.worst_error = None
    # ------------------------------------------------------------------ performance (GPU)
    if stage.perf is None:
        res.perf_note = "not timed (no performance case)"
        return res
    if not HAS_CUDA:
        res.perf_note = "needs a GPU"
        return res
    if res.correctness != PASS:
        res.perf_note = "not timed: correctness failed"
        return res
    try:
        from common.timing import bench, bench_graph
        cases, timed = perf_cases(stage, load), []
        for p in cases:
            expected = p.baseline()
            err = rel_error(p.submission(), expected)
            if not err <= p.tol:
                res.correctness = FAIL
                res.message = f"{p.label}: differs from {p.baseline_name} by relative error {err:.2e} at the timed size"
                return res

            def check(out, p=p, expected=expected):
                e = rel_error(out, expected)
                if not e <= p.tol:
                    raise _TimedCallWrong(f"{p.label}: the timed (graph-captured) call's output differs from "
                                          f"{p.baseline_name} by relative error {e:.2e}")
            # GPU time by CUDA-graph replay, for the submission and the baseline alike: launch
            # and Python overhead and a busy CPU (other grading processes) stay out of it.
            # Calls that cannot be captured are timed eagerly, and the report says so.
            try:
                ms = bench_graph(p.submission, check=check).median_ms
                base = bench_graph(p.baseline).median_ms
                how = "cuda-graph replay"
            except _TimedCallWrong as e:
                res.correctness = FAIL
                res.message = str(e)
                return res
            except Exception as e:  # noqa: BLE001
                import torch
                torch.cuda.synchronize()
                ms, base = bench(p.submission).median_ms, bench(p.baseline).median_ms
                how = f"eager (graph capture failed: {type(e).__name__})"
            rep = profile(p.submission, calls=3)
            timed.append(dict(label=p.label, ms=ms, baseline_ms=base, flops=p.flops, bytes=p.bytes, timing=how,
                              kernels_per_call=rep.n_kernels, host_transfers_per_call=rep.host_transfers))
        ceil = _ceilings()
        res = replace(res, baseline=cases[0].baseline_name, ceilings=ceil, perf_target=stage.perf_target,
                      **summarize(timed, ceil))
    except Exception as e:  # noqa: BLE001
        res.perf_note = f"timing failed: {type(e).__name__}: {e}"
    return res


def summarize(cases: list[dict], ceilings: dict) -> dict:
    """The :class:`WorkerResult` performance fields from the timed cases (each a dict of label, ms,
    baseline_ms, flops, bytes, timing, kernels_per_call, host_transfers_per_call), pure: each case
    gets its speedup, bound and roofline fraction; over all of them ``speedup``, what is scored,
    is the geometric mean of the per-case speedups (score.combined_speedup); ms, baseline_ms,
    flops and bytes are sums (the achieved rate is all the work over all the time), the roofline
    point is that of the sums, kernels and host transfers per call the largest of any case."""
    from common.roofline import Ceilings, Point
    c = Ceilings(**ceilings)
    done = []
    for k in cases:
        pt = Point(k["label"], k["flops"], k["bytes"], k["ms"])
        done.append({**k, "speedup": k["baseline_ms"] / k["ms"], "bound": pt.bound(c),
                     "roofline_fraction": pt.fraction(c)})
    total = Point("all", sum(k["flops"] for k in done), sum(k["bytes"] for k in done), sum(k["ms"] for k in done))
    label = done[0]["label"] if len(done) == 1 else \
        f"geometric mean over {len(done)} shapes: " + "; ".join(k["label"] for k in done)
    return dict(ms=total.ms, baseline_ms=sum(k["baseline_ms"] for k in done), perf_label=label,
                speedup=combined_speedup([k["speedup"] for k in done]), bound=total.bound(c),
                roofline_fraction=total.fraction(c), flops=total.flops, bytes=total.bytes,
                kernels_per_call=max(k["kernels_per_call"] for k in done),
                host_transfers_per_call=max(k["host_transfers_per_call"] for k in done),
                timing="; ".join(dict.fromkeys(k["timing"] for k in done)), cases=done)


class _TimedCallWrong(AssertionError):
    """The graph-captured performance call did not reproduce the checked output."""


def _ceilings() -> dict:
    """Measured copy bandwidth and bf16 matmul rate of this GPU, cached per device name."""
    import torch

    from common.cuda_ext import cache_dir
    from common.roofline import measure_ceilings
    name = torch.cuda.get_device_name()
    path = cache_dir() / "ceilings.json"
    cache = json.loads(path.read_text()) if path.exists() else {}
    if name not in cache:
        c = measure_ceilings()
        cache[name] = {"gbps": c.gbps, "tflops": c.tflops, "source": c.source}
        path.write_text(json.dumps(cache, indent=1))
    return cache[name]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.grade.worker",
                                 description="One stage's trials and timing (the grader runs this; see run.py).")
    ap.add_argument("stage", help="stage key, e.g. a03")
    ap.add_argument("--impl", required=True)
    args = ap.parse_args(argv)
    try:
        res = run_stage(args.impl, args.stage)
    except Exception as e:  # noqa: BLE001
        res = WorkerResult(correctness=FAIL,
                           message=f"{type(e).__name__}: {e} | {traceback.format_exc().splitlines()[-2][:200]}")
    print(MARK + res.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
