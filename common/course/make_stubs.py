"""Write ``assignments/`` from ``solutions/``: the solutions are the single source of every stage.

    python -m common.course.make_stubs            # rewrite assignments/ (stage files, not the handouts)
    python -m common.course.make_stubs --check    # exit 1 and list the files that differ (tests run this)

Each student region in a solution file is marked, and carries its stub beside it:

    def forward(self, x):                            // the same in .cu / .cpp, with //
        # TODO(a02): check x's last dim, multiply by self.weight_t, add the bias on the host.
        # STUB: raise NotImplementedError("a02: implement PretransposedLinear.forward")
        # SOLUTION
        in_features = self.weight_t.shape[0]
        ...
        # END TODO(a02)

The stub is everything from the ``TODO(aNN...)`` line up to the ``SOLUTION`` line: comment
lines as they are (the TODO line and its hints), and ``STUB:`` lines uncommented at their
own indentation (``# STUB: pass`` becomes ``pass``; a kernel body that writes nothing has no
``STUB:`` line). The solution, from ``SOLUTION`` to ``END TODO(aNN...)``, is left out.

A file goes to ``assignments/`` only if the student has something to do in it (a TODO region),
or if the stubs need it to import and build (``needed``): the package's ``__init__.py``, the C++
``binding.cpp``, the Python loader that builds the stage's CUDA sources (it calls
``common.cuda_ext.load_op``), and a given module that a copied file imports from its own stage
(stage 7's ``flash_configs.py``). Given code outside those (the benchmarks: ``python -m common.course.bench
aNN --impl assignments`` runs solutions/' bench on your work) stays in ``solutions/``. Given code
in a copied file is copied as it is, except that references to the solutions tree
(``solutions.a06_matmul``, ``solutions/a06_matmul``) become ``assignments.``/``assignments/``.
Each stage's ``README.md`` is not generated: the one in ``assignments/`` is the handout, the one
in ``solutions/`` the solution notes, both written by hand.
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "solutions"
TARGET = REPO / "assignments"

#: comment leader per file type; these files are scanned for regions and references
COMMENT = {".py": "#", ".toml": "#", ".cu": "//", ".cuh": "//", ".cpp": "//", ".h": "//"}
#: written by hand in both trees, never generated
HAND_WRITTEN = ("README.md",)
SKIP_PARTS = {"__pycache__", ".ipynb_checkpoints"}

_LEAD = r"^(?P<indent>[ \t]*)(?P<lead>#|//) "
START = re.compile(_LEAD + r"TODO\((?P<tag>a\d\d[^)]*)\)")
STUB = re.compile(_LEAD[:-1] + r" ?STUB:(?: (?P<code>.*))?$")
SOLUTION = re.compile(_LEAD + r"SOLUTION\s*$")
END = re.compile(_LEAD + r"END TODO\((?P<tag>a\d\d[^)]*)\)\s*$")
REFERENCE = re.compile(r"\bsolutions(?=[./]a\d\d_)")


class MarkerError(ValueError):
    pass


def stub_text(text: str, name: str = "<text>") -> str:
    """The stub of one solution file's text: every marked region replaced by its stub."""
    out: list[str] = []
    state, tag, where = "given", None, 0        # given -> stub -> solution -> given
    for no, line in enumerate(text.splitlines(keepends=True), 1):
        body = line.rstrip("\r\n")
        start, stub, sol, end = START.match(body), STUB.match(body), SOLUTION.match(body), END.match(body)
        if state == "given":
            if start:
                state, tag, where = "stub", start["tag"], no
                out.append(line)
            elif stub or sol or end:
                raise MarkerError(f"{name}:{no}: {body.strip()!r} outside a TODO region")
            else:
                out.append(line)
        elif state == "stub":
            if stub:
                code = stub["code"] or ""
                out.append((stub["indent"] + code if code else "") + line[len(body):])
            elif sol:
                state = "solution"
            elif start or end:
                raise MarkerError(f"{name}:{no}: {body.strip()!r} before the SOLUTION line of the "
                                  f"TODO({tag}) region that starts on line {where}")
            else:
                out.append(line)
        else:  # solution
            if end:
                if end["tag"] != tag:
                    raise MarkerError(f"{name}:{no}: END TODO({end['tag']}) closes TODO({tag}) (line {where})")
                state, tag = "given", None
            elif start or stub or sol:
                raise MarkerError(f"{name}:{no}: {body.strip()!r} inside the solution of TODO({tag}) "
                                  f"(line {where}); regions do not nest")
    if state != "given":
        raise MarkerError(f"{name}:{where}: the TODO({tag}) region has no "
                          f"{'SOLUTION line' if state == 'stub' else 'END TODO line'}")
    return REFERENCE.sub("assignments", "".join(out))


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*")
                  if p.is_file() and not SKIP_PARTS & set(p.relative_to(root).parts) and p.suffix != ".pyc")


#: copied without a TODO region: the stubs need them to import and to build
BINDINGS = ("__init__.py", "binding.cpp")
#: ... and so is a loader that builds the stage's CUDA sources
LOADER = re.compile(r"^from common\.cuda_ext import .*\bload_op\b", re.M)


def needed(rel: Path, text: str) -> bool:
    """Whether a solution file goes to assignments/: it has a TODO region, or the stubs need it."""
    return (rel.name in BINDINGS or any(START.match(line) for line in text.splitlines())
            or (rel.suffix == ".py" and bool(LOADER.search(text))))


#: a relative import inside a stage (``from .flash_configs import ...``): the module it names is needed too
RELATIVE = re.compile(r"^\s*from \.(\w+) import ", re.M)


def generated(source: Path = SOURCE) -> dict[Path, bytes]:
    """What ``assignments/`` should hold, file by file (relative paths), hand-written files left out.

    Given modules that a copied file imports from its own stage (``from .flash_configs import CONFIGS``
    in stage 7's flash_triton.py) are copied too, as they are: the stubs must import."""
    out = {}
    files = [rel for rel in _files(source) if not (rel.name in HAND_WRITTEN and len(rel.parts) > 1)
             and rel.suffix in COMMENT]
    todo = [rel for rel in files if needed(rel, (source / rel).read_text())]
    while todo:
        rel = todo.pop()
        if rel in out:
            continue
        out[rel] = stub_text((source / rel).read_text(), f"solutions/{rel}").encode()
        if rel.suffix == ".py":
            todo += [dep for name in RELATIVE.findall(out[rel].decode())
                     if (dep := rel.parent / f"{name}.py") in files and dep not in out]
    return dict(sorted(out.items()))


def differences(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """Files of ``target`` that differ from what ``source`` generates (missing, changed, extra)."""
    want = generated(source)
    have = {rel for rel in _files(target) if not (rel.name in HAND_WRITTEN and len(rel.parts) > 1)}
    diff = [f"{rel}: {'changed' if rel in have else 'missing'}" for rel, data in want.items()
            if rel not in have or (target / rel).read_bytes() != data]
    diff += [f"{rel}: not in solutions/" for rel in sorted(have - set(want))]
    return diff


def write(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """Rewrite ``target`` from ``source``; remove generated files that no longer have a source.
    Returns the paths written or removed."""
    want = generated(source)
    done = []
    for rel, data in want.items():
        path = target / rel
        if not path.exists() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            shutil.copymode(source / rel, path)
            done.append(f"wrote {rel}")
    for rel in _files(target):
        if rel not in want and not (rel.name in HAND_WRITTEN and len(rel.parts) > 1):
            (target / rel).unlink()
            done.append(f"removed {rel}")
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.course.make_stubs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if assignments/ differs")
    args = ap.parse_args(argv)
    if args.check:
        diff = differences()
        for d in diff:
            print(d)
        print(f"assignments/: {len(diff)} file(s) differ from what solutions/ generates"
              + ("; run python -m common.course.make_stubs" if diff else ""))
        return 1 if diff else 0
    for d in write():
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
