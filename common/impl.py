"""Impl switching: choose which implementation tree is graded or benchmarked.

An *impl* is a folder with the layout of ``assignments/`` (``a01_.../``,
``a02_.../``, ...): ``assignments`` (the default), ``solutions``, or a path to a
student's submission. Choose it with ``pytest --impl X``, ``make grade IMPL=X``,
a bench's ``--impl X`` or the ``COURSE_IMPL`` environment variable (``ENV_VAR``).

One object carries it everywhere: ``Impl`` (its folder, import name, torch-operator
namespace and ``load``). Tests get it as the ``impl`` fixture, the grader and the benches
from their ``--impl``.

    from common.impl import Impl
    impl = Impl.get("solutions")                        # None: COURSE_IMPL, else assignments
    gelu = impl.load("a05_triton_gelu.gelu_triton")     # solutions.a05_triton_gelu.gelu_triton
    impl.path("a05_triton_gelu")                        # its folder

``load(module, impl=None)``, ``resolve(impl=None)`` and ``stage_dir`` are the same as
functions.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
ENV_VAR = "COURSE_IMPL"
#: Stages to take from solutions/ when another stage imports them (``--borrow a06,a07``: try stage 8,
#: which runs on a06's matmul and a07's attention, before those are done). See :func:`borrowed`.
BORROW_VAR = "COURSE_BORROW"
NAMED = ("assignments", "solutions")
_SUBMISSION_PREFIX = "course_impl_"


def resolve(impl: str | os.PathLike | Impl | None = None) -> Path:
    """Folder of an impl given as 'assignments', 'solutions' or a path (None: ``COURSE_IMPL``,
    else 'assignments')."""
    if isinstance(impl, Impl):
        return impl.root
    impl = impl if impl is not None else os.environ.get(ENV_VAR, "assignments")
    p = REPO / str(impl) if str(impl) in NAMED else Path(impl).expanduser().resolve()
    if not p.is_dir():
        raise FileNotFoundError(
            f"impl {str(impl)!r}: no such folder ({p}); expected 'assignments', 'solutions' "
            "or a path to a folder laid out like assignments/ (a01_roundtrip_linear/, ...)")
    return p


def package_name(root: Path) -> str:
    """Import name of an impl: 'assignments'/'solutions', or ``course_impl_<hash>`` for a path."""
    if root.parent == REPO and root.name in NAMED:
        return root.name
    return _SUBMISSION_PREFIX + hashlib.sha1(str(root).encode()).hexdigest()[:10]


def op_namespace(module_name: str) -> str:
    """Torch-operator namespace for the impl a module belongs to.

    ``op_namespace(__name__)`` in ``solutions.a05_triton_gelu.gelu_triton`` gives
    ``course_solutions``; in ``assignments...`` ``course_assignments``; in a
    submission (imported as ``course_impl_<hash>``) ``course_impl_<hash>``. Each impl
    registers its ops under its own namespace, so assignments and solutions can be
    imported in one process.
    """
    package = module_name.split(".")[0]
    return package if package.startswith(_SUBMISSION_PREFIX) else "course_" + package


@dataclass(frozen=True)
class Impl:
    """One implementation tree: ``root`` (its folder), ``package`` (the name it is imported
    under), ``namespace`` (its torch operators') and ``load``."""

    root: Path

    @classmethod
    def get(cls, impl: str | os.PathLike | Impl | None = None) -> Impl:
        """The impl named 'assignments' / 'solutions' or at a path; None: ``COURSE_IMPL``,
        else 'assignments'."""
        return impl if isinstance(impl, Impl) else cls(resolve(impl))

    @property
    def package(self) -> str:
        return package_name(self.root)

    @property
    def namespace(self) -> str:
        return op_namespace(self.package)

    @property
    def name(self) -> str:
        """'assignments' / 'solutions', or the submission's path."""
        return self.package if self.package in NAMED else str(self.root)

    def load(self, module: str) -> ModuleType:
        """Import ``<impl>.<module>``, e.g. ``impl.load("a03_fused_linear.fused_linear")``."""
        return importlib.import_module(f"{_register(self.root)}.{module}")

    def path(self, stage: str = "") -> Path:
        """Folder of one stage inside the impl (``impl.path("a01_roundtrip_linear")``)."""
        return self.root / stage if stage else self.root

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Impl({self.name})"


def stage_keys() -> dict[str, str]:
    """The course's stages, key -> the name of its test file without ``test_`` ("a03" ->
    "a03_fused_linear", "a07c" -> "a07c_flash_hopper"): read from tests/, one file a stage."""
    found = (re.fullmatch(r"test_(a\d\d[a-z]?)_\w+\.py", p.name) for p in (REPO / "tests").iterdir())
    return {m[1]: m[0][len("test_"):-len(".py")] for m in sorted(filter(None, found), key=lambda m: m[0])}


class StageError(ValueError):
    """A stage name that names no stage (the message lists the stages)."""


def stage_key(name: str, allowed: list[str] | None = None) -> str:
    """The stage's key ("a03") for any of its names: ``a03``, ``3``, ``03``, ``a3``, the folder
    ``a03_fused_linear`` or the test file's ``a03_fused_linear``; ``7c``/``a07c`` is stage 7's Hopper part.
    The one place a stage name is read (make check/grade/bench/ncu, ``--stages``, the benches, ncu).
    ``allowed``: the keys the command takes (default: every stage). Anything else: :class:`StageError`
    naming the stages."""
    keys = stage_keys()
    allowed = list(keys) if allowed is None else list(allowed)
    text = str(name).strip().lower()
    m = re.fullmatch(r"a?0*(\d{1,2})([a-z]?)", text)
    key = f"a{int(m[1]):02d}{m[2]}" if m else None
    if key is None:
        folders = {f: f[:3] for f in _stage_folders()}
        key = next((k for k, stem in keys.items() if text == stem), None) or folders.get(text)
    if key not in allowed:
        why = f"stage {key} is not one this command takes" if key in keys else "no such stage"
        raise StageError(f"{name!r}: {why}. Stages: {', '.join(allowed)} (stage 3 is a03, 3, 03 or "
                         f"a03_fused_linear)")
    return key


def stage_list(names: str, allowed: list[str] | None = None) -> list[str]:
    """``stage_key`` of each name of a comma-separated list ("3,a05" -> ["a03", "a05"]), in order, once each."""
    parts = [n for n in str(names).split(",") if n.strip()]
    if not parts:
        raise StageError(f"{names!r}: no stage named. Stages: {', '.join(allowed or stage_keys())}")
    return list(dict.fromkeys(stage_key(n, allowed) for n in parts))


def _stage_folders() -> list[str]:
    return sorted(p.name for p in (REPO / "solutions").iterdir() if p.is_dir() and re.match(r"a\d\d_", p.name))


def borrowed() -> list[str]:
    """The stage folders ``COURSE_BORROW`` names ("a06,a07" -> ["a06_matmul", "a07_flash_attention"])."""
    keys = [k.strip() for k in os.environ.get(BORROW_VAR, "").split(",") if k.strip()]
    folders = _stage_folders()
    out = []
    for k in keys:
        match = [f for f in folders if f == k or f.startswith(k + "_")]
        if not match:
            raise ValueError(f"{BORROW_VAR}={os.environ[BORROW_VAR]!r}: no stage {k!r}; stages: {[f[:3] for f in folders]}")
        out += match
    return out


def _register(root: Path) -> str:
    name = package_name(root)
    if name not in sys.modules and name != "solutions":
        # Borrowed stages: <impl>.a06_matmul IS solutions.a06_matmul, so `from ..a06_matmul import ...` in
        # the impl's stage 8 runs the reference a06 (its submodules load from solutions/ under the impl's name).
        for folder in borrowed():
            if str(REPO) not in sys.path:
                sys.path.insert(0, str(REPO))
            sys.modules[f"{name}.{folder}"] = importlib.import_module(f"solutions.{folder}")
    if name not in sys.modules:
        if name in NAMED:
            if str(REPO) not in sys.path:
                sys.path.insert(0, str(REPO))
            importlib.import_module(name)
        else:  # a submission folder: make it an importable package under a unique name
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(root)]
            mod = importlib.util.module_from_spec(spec)
            mod.__path__ = [str(root)]
            sys.modules[name] = mod
    return name


def load(module: str, impl: str | os.PathLike | Impl | None = None) -> ModuleType:
    """Import ``<impl>.<module>``, e.g. ``load("a03_fused_linear.fused_linear")``."""
    return Impl.get(impl).load(module)


def stage_dir(stage: str, impl: str | os.PathLike | Impl | None = None) -> Path:
    """Folder of one stage inside an impl, e.g. ``stage_dir("a01_roundtrip_linear")``."""
    return Impl.get(impl).path(stage)


IMPL_HELP = "assignments (your work), solutions (the reference), or a path laid out like assignments/"


def add_impl_argument(parser, module_name: str | None = None, *, default: str | None = None,
                      required: bool = False, help: str | None = None) -> None:
    """``--impl``, the one definition every command line of the course uses (the grader and its
    worker, ncu, portability, the benches, pytest): 'assignments', 'solutions' or a path. Its default
    is ``default`` if given, else the tree ``module_name`` belongs to (a bench run as
    ``python -m solutions.a06_matmul.bench`` benchmarks solutions/), else ``COURSE_IMPL``, else
    'assignments'; ``required``: no default (a process another one starts). ``parser``: an argparse
    parser, or pytest's (``addoption``: there the default is None and ``COURSE_IMPL`` is read when the
    impl is imported)."""
    if hasattr(parser, "addoption"):
        parser.addoption("--impl", default=None, help=help or f"{IMPL_HELP} (default: {ENV_VAR}, else assignments)")
        return
    if required:
        parser.add_argument("--impl", required=True, help=help or IMPL_HELP)
        return
    tree = (module_name or "").split(".")[0]
    if default is None:
        default = tree if tree in NAMED else os.environ.get(ENV_VAR, "assignments")
    parser.add_argument("--impl", default=default, help=f"{help or IMPL_HELP} (default: %(default)s)")


def command_line(module_name: str, argv: list[str] | None = None) -> str:
    """``python -m <module_name> <args>``: the command a bench records beside its numbers
    (``argv`` None: this process's arguments)."""
    return " ".join(["python -m " + module_name, *(sys.argv[1:] if argv is None else argv)])


def results_dir(impl: str | os.PathLike | Impl | None = None) -> Path:
    """Where a bench writes its tables by default: ``lectures/results/`` for the solutions (the
    committed H100 numbers), ``lectures/results/<folder name>/`` for any other impl, so that a
    run of your work never overwrites them."""
    impl = Impl.get(impl)
    results = REPO / "lectures" / "results"
    return results if impl.package == "solutions" else results / impl.root.name


def _main(argv: list[str]) -> int:
    """``python -P common/impl.py stage NAME [COMMAND]``: what the Makefile passes on for a stage
    name (without importing torch): for ``check``, the stage's test file; else the keys (a comma list
    for ``grade``). A name that is no stage: the message on stderr and exit status 2."""
    if len(argv) < 2 or argv[0] != "stage":
        print("usage: python -P common/impl.py stage NAME [check|grade|bench|ncu]", file=sys.stderr)
        return 2
    what = argv[2] if len(argv) > 2 else "grade"
    try:
        if what == "check":
            print(f"tests/test_{stage_keys()[stage_key(argv[1])]}.py")
        elif what == "grade":
            print(",".join(stage_list(argv[1])))
        else:
            print(stage_key(argv[1]))
    except StageError as e:
        print(f"STAGE={e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
