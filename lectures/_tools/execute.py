"""Execute lecture notebooks without Jupyter, and keep their outputs.

    python lectures/_tools/execute.py lectures/0*.ipynb --out lectures/rendered

A small, dependency-free stand-in for ``jupyter nbconvert --execute`` for machines
that have Python, torch and matplotlib but no Jupyter (the course's GPU machine).
Each notebook runs in its own Python process, its cells in one namespace, with the
notebook's folder as the working directory. What a cell prints (stdout, stderr),
the value of its last expression and every matplotlib figure it draws (as PNG,
like the inline backend) become nbformat-4 outputs, written with the json module.
A cell that raises records the traceback as an error output; the remaining cells
are not run (with ``--allow-errors``: they are) and the exit status is 1. The
executed copy is rewritten after every cell, so a notebook stopped by ``--timeout``
keeps what it had done. CI executes the notebooks with nbclient
(tests/test_notebooks.py); this tool is only for rendering where Jupyter is absent.
"""
from __future__ import annotations

import argparse
import ast
import base64
import contextlib
import io
import json
import linecache
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path


class _Outputs:
    """Ordered nbformat outputs of one cell; consecutive stream text is merged."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        last = self.items[-1] if self.items else None
        if last and last["output_type"] == "stream" and last["name"] == name:
            last["text"] += text
        else:
            self.items.append({"output_type": "stream", "name": name, "text": text})

    def data(self, data: dict, result_count: int | None = None) -> None:
        out = {"output_type": "display_data", "data": data, "metadata": {}}
        if result_count is not None:
            out = {"output_type": "execute_result", "data": data, "metadata": {},
                   "execution_count": result_count}
        self.items.append(out)

    def finish(self) -> list[dict]:
        for o in self.items:  # nbformat stores multi-line strings as lists of lines
            if o["output_type"] == "stream":
                o["text"] = o["text"].splitlines(keepends=True)
            elif "text/plain" in o.get("data", {}):
                o["data"]["text/plain"] = o["data"]["text/plain"].splitlines(keepends=True)
        return self.items


class _Writer(io.TextIOBase):
    def __init__(self, outs: _Outputs, name: str) -> None:
        self.outs, self.name = outs, name

    def write(self, s: str) -> int:
        self.outs.stream(self.name, s)
        return len(s)

    def flush(self) -> None:
        pass


def _figures_to_outputs(outs: _Outputs) -> None:
    """Every open matplotlib figure becomes a PNG output, then is closed (inline-backend style)."""
    if "matplotlib.pyplot" not in sys.modules:
        return
    import matplotlib.pyplot as plt
    for num in plt.get_fignums():
        fig = plt.figure(num)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight", dpi=90)
        outs.data({"image/png": base64.b64encode(buf.getvalue()).decode(),
                   "text/plain": f"<Figure size {fig.get_figwidth() * fig.dpi:.0f}x"
                                 f"{fig.get_figheight() * fig.dpi:.0f} with {len(fig.axes)} Axes>"})
    plt.close("all")


def _run_cell(src: str, ns: dict, outs: _Outputs, count: int, filename: str) -> bool:
    """Run one cell's source; True when it finished without raising."""
    # Keep the cell's source where inspect.getsource looks (linecache), as IPython
    # does: @triton.jit and tracebacks need the source of functions defined in cells.
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    tree = ast.parse(src, filename=filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    try:
        exec(compile(tree, filename, "exec"), ns)
        if last is not None:
            value = eval(compile(last, filename, "eval"), ns)
            if value is not None:
                outs.data({"text/plain": repr(value)}, result_count=count)
        _figures_to_outputs(outs)
        return True
    except Exception as e:  # noqa: BLE001  (record any error in the notebook)
        _figures_to_outputs(outs)
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        outs.items.append({"output_type": "error", "ename": type(e).__name__, "evalue": str(e),
                           "traceback": [line.rstrip("\n") for line in tb]})
        return False


def _write(nb: dict, out_path: Path) -> None:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(out_path)


def execute_one(path: Path, out_path: Path, allow_errors: bool = False) -> bool:
    """Execute one notebook in this process; write it with outputs to ``out_path``."""
    # Agg, whatever the environment says: a GPU image may set MPLBACKEND to Jupyter's inline
    # backend (matplotlib_inline), which outside Jupyter makes `import matplotlib` itself fail.
    os.environ["MPLBACKEND"] = "Agg"
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nb = json.loads(path.read_text())
    ns: dict = {"__name__": "__main__"}
    cur: list[_Outputs] = [_Outputs()]

    def show(*_a, **_k) -> None:       # plt.show(): emit the open figures here, in order
        _figures_to_outputs(cur[0])

    def display(*objs, **_k) -> None:  # the IPython builtin, text only
        for o in objs:
            cur[0].data({"text/plain": repr(o)})

    plt.show = show
    ns["display"] = display
    os.chdir(path.parent)
    sys.path.insert(0, str(path.parent))
    ok, count, t0 = True, 0, time.time()
    for cell in nb["cells"]:            # a copy stopped midway shows which cells never ran
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if not ok and not allow_errors:  # after an error, like nbclient: leave the rest unrun
            continue
        count += 1
        outs = _Outputs()
        cur[0] = outs
        tc = time.time()
        with contextlib.redirect_stdout(_Writer(outs, "stdout")), \
                contextlib.redirect_stderr(_Writer(outs, "stderr")):
            cell_ok = _run_cell(src, ns, outs, count, f"<{path.name} cell {i}>")
        ok = ok and cell_ok
        cell["outputs"] = outs.finish()
        cell["execution_count"] = count
        _write(nb, out_path)
        print(f"  cell {i:2d}: {time.time() - tc:6.1f} s{'' if cell_ok else '  ERROR'}", file=sys.stderr, flush=True)
    nb.setdefault("metadata", {})["course_executed"] = {
        "by": "lectures/_tools/execute.py", "seconds": round(time.time() - t0, 1), "ok": ok,
        "python": sys.version.split()[0], "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    _write(nb, out_path)
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="folder for the executed copies")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per notebook")
    ap.add_argument("--allow-errors", action="store_true", help="run the cells after a failing one too")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # internal: run in this process
    a = ap.parse_args(argv)
    if a.one:
        (nb,) = a.notebooks
        return 0 if execute_one(nb.resolve(), (a.out / nb.name).resolve(), a.allow_errors) else 1
    failed = []
    for nb in a.notebooks:
        t0 = time.time()
        print(f"[execute] {nb}", file=sys.stderr, flush=True)
        try:
            rc = subprocess.run([sys.executable, __file__, "--one", str(nb), "--out", str(a.out)]
                                + (["--allow-errors"] if a.allow_errors else []), timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print(f"[execute] {nb.name}: {'ok' if rc == 0 else f'FAILED ({rc})'} in {time.time() - t0:.1f} s",
              file=sys.stderr, flush=True)
        if rc != 0:
            failed.append(nb.name)
    if failed:
        print(f"[execute] failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
