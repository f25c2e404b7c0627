"""Many submissions at once: one grading process per GPU present (or ``--jobs`` on a CPU),
each ``python -m common.grade --impl <submission>`` writing that submission's results.json
(Gradescope) and report.json.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .run import REPO


def grade_many(folder: Path, out: Path, jobs: int, timeout: float, stages, run_tests: bool = True) -> int:
    """Grade every sub-folder of ``folder``, one process per GPU (or ``jobs`` on CPU)."""
    subs = sorted(p for p in folder.iterdir() if p.is_dir())
    import torch
    gpus = list(range(torch.cuda.device_count()))
    slots = gpus or list(range(max(1, jobs)))
    out.mkdir(parents=True, exist_ok=True)
    free = list(slots)
    import threading
    lock = threading.Lock()

    def one(sub: Path) -> str:
        with lock:
            slot = free.pop()
        try:
            env = dict(os.environ)
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(slot)
            dest = out / sub.name
            cmd = [sys.executable, "-m", "common.grade", "--impl", str(sub), "--quiet",
                   "--results-json", str(dest / "results.json"), "--json-out", str(dest / "report.json"),
                   "--timeout", str(timeout)] + (["--stages", ",".join(stages)] if stages else []) \
                + ([] if run_tests else ["--no-tests"])
            t0 = time.time()
            r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            (out / f"{sub.name}.log").write_text(r.stdout + r.stderr)
            where = f"GPU {slot}" if gpus else f"worker {slot}"
            return f"{sub.name}: exit {r.returncode} on {where} in {time.time() - t0:.0f} s"
        finally:
            with lock:
                free.append(slot)

    with ThreadPoolExecutor(max_workers=len(slots)) as pool:
        for line in pool.map(one, subs):
            print(line, flush=True)
    return 0

