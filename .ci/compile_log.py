"""pytest plugin: where a cold test run's time goes, per test. Load it with
``PYTHONPATH=.ci python -m pytest -p compile_log ...`` (used by ``.ci/gpu-check``'s suite step).

Records every Triton compile (kernel, seconds, thread: compiles in ``common.timing.precompile``'s
threads run side by side, so their seconds add up to more than the wall time they took), every
autotuning of a new key (wall seconds, compiles included) and every CUDA extension build
(``torch.utils.cpp_extension.load``), against the test that was running. At the end it prints
the tests that spent most and the totals, and writes them to ``$COMPILE_LOG_JSON`` if set.
Under pytest-xdist (a GPU run over whole folders has workers) each worker leaves its records in a
folder the controller made, and the controller's summary adds them up.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections import defaultdict

import pytest

_RECORDS: list[tuple[str, str, str, float, str]] = []   # (test, kind, name, seconds, thread)
_TEST = ["<collection>"]
_CACHE_HIT_S = 0.05   # a compile that returns this fast was read from Triton's cache


def _record(kind: str, name: str, seconds: float) -> None:
    _RECORDS.append((_TEST[0], kind, name, seconds, threading.current_thread().name))


def _timed(owner, attr: str, kind: str, name_of, grew=None) -> None:
    """Replace ``owner.attr`` by a wrapper that records its seconds as ``kind``, named by
    ``name_of(args, kwargs)``; with ``grew(args)`` (checked before and after), only calls after
    which it is larger (an autotuner whose cache gained a key)."""
    inner = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        n, t = grew(args) if grew else 0, time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            if not grew or grew(args) > n:
                _record(kind, name_of(args, kwargs), time.perf_counter() - t)
    setattr(owner, attr, wrapper)


def _install() -> None:
    import torch.utils.cpp_extension as cpp
    import triton.compiler as compiler
    from triton.runtime.autotuner import Autotuner

    import common.timing as timing
    # a kernel's first launch looks compile up in triton.compiler (JITFunction.create_binder)
    _timed(compiler, "compile", "compile", lambda a, k: getattr(getattr(a[0], "fn", None), "__name__", "?"))
    _timed(Autotuner, "run", "autotune", lambda a, k: a[0].base_fn.__name__, grew=lambda a: len(a[0].cache))
    _timed(cpp, "load", "cuda_build", lambda a, k: k.get("name", "?"))
    _timed(timing, "precompile", "precompile", lambda a, k: getattr(a[0], "base_fn", a[0]).__name__)


_install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _TEST[0] = item.nodeid
    yield
    _TEST[0] = "<between tests>"


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["COMPILE_LOG_WORKERS"] = tempfile.mkdtemp(prefix="compile-log-")   # the workers inherit it


def pytest_sessionfinish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and os.environ.get("COMPILE_LOG_WORKERS"):
        with open(os.path.join(os.environ["COMPILE_LOG_WORKERS"], f"{worker}.json"), "w") as f:
            json.dump([r[:4] + (f"{worker}/{r[4]}",) for r in _RECORDS], f)


def _all_records() -> list:
    records = list(_RECORDS)
    folder = os.environ.get("COMPILE_LOG_WORKERS")
    for name in sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else ():
        with open(os.path.join(folder, name)) as f:
            records += [tuple(r) for r in json.load(f)]
    return records


def pytest_terminal_summary(terminalreporter):
    per = defaultdict(lambda: defaultdict(float))
    count = defaultdict(int)
    records = _all_records()
    for test, kind, name, s, thread in records:
        if kind == "compile" and s < _CACHE_HIT_S:
            kind = "compile_cached"
        per[test][kind] += s
        count[(test, kind)] += 1
    kinds = ["compile", "compile_cached", "precompile", "autotune", "cuda_build"]
    w = terminalreporter.write_line
    w("")
    w("compile log (s; compile = seconds summed over threads, n = count): " + ", ".join(kinds))
    total = defaultdict(float)
    for test, d in per.items():
        for k, v in d.items():
            total[k] += v
    top = sorted(per, key=lambda t: -(per[t]["compile"] + per[t]["cuda_build"] + per[t]["autotune"]))[:25]
    for t in top:
        d = per[t]
        w(f"  {t[:110]:110s} " + " ".join(f"{k}={d[k]:.1f}/{count[(t, k)]}" for k in kinds if d[k] or count[(t, k)]))
    w("  TOTAL " + " ".join(f"{k}={total[k]:.1f}" for k in kinds))
    path = os.environ.get("COMPILE_LOG_JSON")
    if path:
        with open(path, "w") as f:
            json.dump({"records": records, "total": total}, f)
