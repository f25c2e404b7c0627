"""Many submissions at once, kept apart: one grading process per GPU present (or ``--jobs`` on a
CPU), each ``python -m common.course.grade --impl <its copy>``, writing that submission's results.json
(Gradescope) and report.json.

Each submission is graded

* from its own copy, in a folder of its own (with its own temporary files and its own Triton and
  CUDA-extension caches, so one submission cannot plant a compiled kernel another one loads);
* in a sandbox where the system allows one (Linux user and mount namespaces: ``unshare``): the
  course tree is read-only, the folder of submissions and every other submission's copy are
  hidden, and there is no network (a new network namespace holds only loopback, down);
* with a time limit (the stages' limits added up) and a memory limit (``--memory-gb``: the whole
  process tree's resident memory, checked every second; the tree is killed past it).

Where no sandbox can be made (no ``unshare``, or user namespaces disabled) the copy, the separate
caches and the limits still hold, and the batch says so: grade in a container then
(INSTRUCTORS.md has a recipe). ``--no-sandbox`` grades in place, for trusted runs only.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from common.impl import stage_keys

from .run import REPO

#: The sandbox, run by ``unshare --user --map-root-user --net --mount --fork sh -c SCRIPT sh ARGS``:
#: $1 the batch's root (every submission's folder: hidden), $2 this submission's folder (kept: it is
#: the working directory while the root is covered), $3 the course tree (read-only), $4 the folder
#: of submissions (hidden); then the command.
SANDBOX = r"""
set -e
mount --make-rprivate /
root=$1 work=$2 course=$3 subs=$4
shift 4
cd "$work"
mount -t tmpfs -o size=1m tmpfs "$root"
mkdir -p "$work"
mount --no-canonicalize --bind /proc/self/cwd "$work"
mount --bind -o ro "$course" "$course"
[ -d "$subs" ] && mount -t tmpfs -o size=1m,ro tmpfs "$subs"
cd "$course"
exec "$@"
"""


@lru_cache(maxsize=1)
def sandbox_available() -> str:
    """'' where a sandbox can be made here, else why not."""
    if not sys.platform.startswith("linux"):
        return f"no sandbox on {sys.platform} (Linux namespaces only)"
    exe = shutil.which("unshare")
    if exe is None:
        return "no sandbox: `unshare` (util-linux) is not installed"
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([exe, "--user", "--map-root-user", "--net", "--mount", "--fork", "sh", "-c",
                            SANDBOX, "sh", d, d, str(REPO), d + "/none", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"no sandbox: unshare failed ({(r.stderr or r.stdout).strip()[:200]}); user namespaces may be disabled"
    return ""


def _tree(pid: int) -> list[int]:
    """pid and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo += children.get(q, [])
    return out


def _rss_gb(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 2**20


def _run_limited(cmd: list[str], env: dict, timeout: float, memory_gb: float, log: Path) -> str:
    """Run ``cmd`` in its own process group; kill the group past ``timeout`` seconds or ``memory_gb``
    of resident memory. '' or what stopped it."""
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        stop, why = threading.Event(), []

        def watch():
            t0 = time.time()
            while not stop.wait(1.0):
                if time.time() - t0 > timeout:
                    why.append(f"killed after {timeout:.0f} s")
                elif Path("/proc").is_dir() and _rss_gb(_tree(p.pid)) > memory_gb:
                    why.append(f"killed at over {memory_gb:g} GB of memory")
                if why:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    return
        w = threading.Thread(target=watch, daemon=True)
        w.start()
        p.wait()
        stop.set()
        w.join()
    return why[0] if why else ""


def grade_many(folder: Path, out: Path, jobs: int, timeout: float, stages, run_tests: bool = True,
               sandbox: bool = True, memory_gb: float = 32.0) -> int:
    """Grade every sub-folder of ``folder``, one process per GPU (or ``jobs`` on CPU), each apart."""
    import torch
    folder, out = folder.resolve(), out.resolve()
    subs = sorted(p for p in folder.iterdir() if p.is_dir())
    gpus = list(range(torch.cuda.device_count()))
    slots = gpus or list(range(max(1, jobs)))
    out.mkdir(parents=True, exist_ok=True)
    why_not = sandbox_available() if sandbox else "--no-sandbox"
    if why_not:
        print(f"grading WITHOUT a sandbox ({why_not}): each submission still runs from its own copy with its "
              "own caches and limits, but can read and write what this user can. Use a container for "
              "untrusted code (INSTRUCTORS.md).", flush=True)
    n_stages = len(stages) if stages else len(stage_keys())
    limit = timeout * 2 * n_stages + 300          # tests, then trials and timing, per stage
    root = Path(tempfile.mkdtemp(prefix="course-batch-"))
    free = list(slots)
    lock = threading.Lock()

    def one(sub: Path) -> str:
        with lock:
            slot = free.pop()
        work = root / sub.name
        try:
            impl = work / "impl"
            shutil.copytree(sub, impl, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), symlinks=False)
            for d in ("tmp", "home", "cache/ext", "cache/triton"):
                (work / d).mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, TMPDIR=str(work / "tmp"), HOME=str(work / "home"),
                       XDG_CACHE_HOME=str(work / "cache"), TORCH_EXTENSIONS_DIR=str(work / "cache" / "ext"),
                       TRITON_CACHE_DIR=str(work / "cache" / "triton"), PYTHONDONTWRITEBYTECODE="1")
            env.pop("COURSE_IMPL", None)
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(slot)
            grade = [sys.executable, "-m", "common.course.grade", "--impl", str(impl), "--quiet",
                     "--results-json", str(work / "results.json"), "--json-out", str(work / "report.json"),
                     "--timeout", str(timeout)] + (["--stages", ",".join(stages)] if stages else []) \
                + ([] if run_tests else ["--no-tests"])
            cmd = grade if why_not else [shutil.which("unshare"), "--user", "--map-root-user", "--net", "--mount",
                                         "--fork", "sh", "-c", SANDBOX, "sh", str(root), str(work), str(REPO),
                                         str(folder), *grade]
            dest = out / sub.name
            dest.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            stopped = _run_limited(cmd, env, limit, memory_gb, out / f"{sub.name}.log")
            for name in ("results.json", "report.json"):
                if (work / name).exists():
                    shutil.copy(work / name, dest / name)
            where = f"GPU {slot}" if gpus else f"worker {slot}"
            return (f"{sub.name}: {'no results, ' + stopped if stopped else 'graded'} on {where} in "
                    f"{time.time() - t0:.0f} s{'' if why_not else ' (sandboxed)'}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
            with lock:
                free.append(slot)

    try:
        with ThreadPoolExecutor(max_workers=len(slots)) as pool:
            for line in pool.map(one, subs):
                print(line, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0
