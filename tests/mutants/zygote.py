"""Grader workers forked from one process that imported torch, triton and the harness once (CPU only).

``python -m mutants.grade`` grades each mutant with the grader alone (common.course.grade.judge.run_stage), whose
worker, ``python -m common.course.grade.worker``, is a fresh process per mutant: 4 s of imports (torch, its
dynamo, triton, the harness; transformers for stage 8) before and while it runs the trials, most of what
a mutant of the quick stages costs. Here a *zygote* process makes those imports once, runs no torch op
(no thread pool to inherit) and,
for each worker the judge starts, forks a child that runs ``common.course.grade.worker`` as ``python -m`` would
(``runpy``, the same argv, working directory and environment: the judge's, and a worker started after
the judge changed it beyond SET_BY_TORCH is a new process; stdin /dev/null; stdout and stderr
captured; fresh seeds for ``random`` and NumPy, as a new process has), under the same time limit (the
child is killed, as subprocess.run kills it). The judge reads the same files and exit status (a signal:
negative). The child imports the mutant; the zygote never does, so each worker starts from the state a
new process has after the imports, the guard's snapshot included (taken in the child, before the
submission is imported). On a GPU machine (CUDA is not fork-safe), or where the zygote finds a thread
beside its own at fork time, workers are started as subprocesses, as the grader does.

    python -m mutants.zygote          # the zygote itself (tests/ on sys.path); started by Zygote()
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from common.impl import REPO

WORKER = [sys.executable, "-m", "common.course.grade.worker"]
#: What torch sets in the judge's environment as it runs (inductor's cache folder, the one a worker uses
#: anyway): a worker forked after it appears still gets the judge's environment as it is then.
SET_BY_TORCH = frozenset({"TORCHINDUCTOR_CACHE_DIR"})


class Zygote:
    """``run`` has subprocess.run's signature as common.course.grade.judge calls it (judge.RUN_WORKER)."""

    def __init__(self) -> None:
        self.env = dict(os.environ)    # the judge's, which its workers inherit (forked: while it is the same)
        env = dict(self.env)           # tests/ added where missing (under pytest), for mutants.zygote itself
        path = env.get("PYTHONPATH", "").split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, path + [p for p in (str(REPO), str(REPO / "tests"))
                                                                 if p not in path]))
        self.proc = subprocess.Popen([sys.executable, "-m", "mutants.zygote"], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        self.ready = bool(line) and json.loads(line).get("ready", False)
        self.forked = 0                # workers run as forks (the rest: new processes)
        if not self.ready:
            self.close()

    def run(self, cmd, *, cwd=None, capture_output=False, text=False, timeout=None):
        changed = {k for k in set(os.environ) | set(self.env) if os.environ.get(k) != self.env.get(k)}
        if not (self.ready and cmd[:3] == WORKER and capture_output and text and self.proc.poll() is None
                and changed <= SET_BY_TORCH):
            return subprocess.run(cmd, cwd=cwd, capture_output=capture_output, text=text, timeout=timeout)
        request = {"argv": cmd[3:], "cwd": str(cwd or os.getcwd()), "timeout": timeout, "env": dict(os.environ)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:                                   # the zygote died: a subprocess, as the grader starts one
            self.ready = False
            return subprocess.run(cmd, cwd=cwd, capture_output=capture_output, text=text, timeout=timeout)
        r = json.loads(line)
        self.forked += 1
        if r["timed_out"]:
            raise subprocess.TimeoutExpired(cmd, timeout, output=r["stdout"], stderr=r["stderr"])
        return subprocess.CompletedProcess(cmd, r["returncode"], r["stdout"], r["stderr"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


@contextlib.contextmanager
def forked_workers():
    """Inside: common.course.grade.judge runs its workers through a Zygote (yielded; None on a GPU machine, where
    they stay new processes); after: as the grader does."""
    from common import HAS_CUDA
    from common.course.grade import judge
    zygote = None if HAS_CUDA else Zygote()
    if zygote is not None:
        judge.RUN_WORKER = zygote.run
    try:
        yield zygote
    finally:
        judge.RUN_WORKER = subprocess.run
        if zygote is not None:
            zygote.close()


def _child(req: dict, out: int, err: int) -> None:
    """In the forked child: run the worker as ``python -m common.course.grade.worker ARGV`` would; never returns."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import random

        import numpy as np
        random.seed()
        np.random.seed()
        import runpy
        sys.argv = ["-m", *req["argv"]]                 # run_module sets argv[0] to the module's file, as -m does
        try:
            runpy.run_module("common.course.grade.worker", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:                        # what the interpreter does with it
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception: the traceback on stderr, exit status 1
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, timeout: float | None) -> tuple[int, bool]:
    """(exit status as subprocess reports it, timed out): the child killed at the deadline."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.002
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if deadline is not None and time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status), True
        time.sleep(pause)
        pause = min(0.05, pause * 2)


def serve() -> None:
    import tempfile

    import common
    from common.course.grade.worker import _import_harness
    _import_harness()
    # what the workers import anyway, once they run (no threads started, no op run): torch's dynamo (its
    # FakeTensorMode, custom ops, deterministic mode: every stage), transformers' GPT-2 (stage 8's trials)
    import numpy  # noqa: F401  (the child reseeds it)
    import torch._dynamo  # noqa: F401
    from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401
    import threading
    try:      # the main thread and NumPy's OpenBLAS pool (fork-safe: it re-creates its threads in the child)
        ready = not common.HAS_CUDA and threading.active_count() == 1 and len(os.listdir("/proc/self/task")) <= 2
    except OSError:                                    # no /proc: not Linux
        ready = False
    print(json.dumps({"ready": ready}), flush=True)
    if not ready:
        return
    for line in sys.stdin:
        req = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(req, out.fileno(), err.fileno())
            code, timed_out = _wait(pid, req["timeout"])
            out.seek(0)
            err.seek(0)
            reply = {"returncode": code, "timed_out": timed_out,
                     "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    serve()
