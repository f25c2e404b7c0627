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


def borrowed() -> list[str]:
    """The stage folders ``COURSE_BORROW`` names ("a06,a07" -> ["a06_matmul", "a07_flash_attention"])."""
    keys = [k.strip() for k in os.environ.get(BORROW_VAR, "").split(",") if k.strip()]
    folders = sorted(p.name for p in (REPO / "solutions").iterdir() if p.is_dir() and p.name[:1] == "a")
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
