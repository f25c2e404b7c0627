"""The stubs in assignments/ are generated from solutions/ (common/course/make_stubs.py); not graded, CPU, fast."""
from __future__ import annotations

import pytest

from common.course.make_stubs import MarkerError, differences, stub_text


def test_committed_assignments_are_what_solutions_generate():
    """Byte for byte: edit solutions/ and run `python -m common.course.make_stubs`, never assignments/ by hand."""
    diff = differences()
    assert not diff, ("assignments/ differs from what solutions/ generates (run python -m common.course.make_stubs): "
                      + "; ".join(diff))


PY = '''def f(x):
    """Doc mentioning solutions.a02_x."""
    # TODO(a02): hint one
    #   hint two
    # STUB: raise NotImplementedError("a02: f")
    # SOLUTION
    # a solution comment
    return x
    # END TODO(a02)


from solutions.a02_x.y import z  # and solutions/a02_x/y.py; solutions alone stays
'''

PY_STUB = '''def f(x):
    """Doc mentioning assignments.a02_x."""
    # TODO(a02): hint one
    #   hint two
    raise NotImplementedError("a02: f")


from assignments.a02_x.y import z  # and assignments/a02_x/y.py; solutions alone stays
'''

CU = '''__global__ void k(float* y) {
  // TODO(a04, 2/2): the kernel body.
  //  1. a hint
  // SOLUTION
  y[threadIdx.x] = 1.f;
  // END TODO(a04, 2/2)
}
__device__ float g(float x) {
  // TODO(a04, 1/2): g
  // STUB: return x;  // wrong until you write it
  // STUB:
  // STUB:   // indented
  // SOLUTION
  return 2 * x;
  // END TODO(a04, 1/2)
}
'''

CU_STUB = '''__global__ void k(float* y) {
  // TODO(a04, 2/2): the kernel body.
  //  1. a hint
}
__device__ float g(float x) {
  // TODO(a04, 1/2): g
  return x;  // wrong until you write it

    // indented
}
'''


def test_stub_text_python_and_cuda():
    assert stub_text(PY) == PY_STUB
    assert stub_text(CU) == CU_STUB
    plain = "x = 1\n# TODO note without a stage tag\n"
    assert stub_text(plain) == plain


@pytest.mark.parametrize("text, message", [
    ("# TODO(a01): hint\nx = 1\n", "no SOLUTION line"),
    ("# TODO(a01): hint\n# SOLUTION\nx = 1\n", "no END TODO line"),
    ("# TODO(a01): hint\n# SOLUTION\n# END TODO(a02)\n", r"closes TODO\(a01\)"),
    ("# SOLUTION\n", "outside a TODO region"),
    ("# STUB: pass\n", "outside a TODO region"),
    ("# TODO(a01): a\n# SOLUTION\n# TODO(a01): b\n# SOLUTION\n# END TODO(a01)\n", "do not nest"),
])
def test_stub_text_rejects_broken_markers(text, message):
    with pytest.raises(MarkerError, match=message):
        stub_text(text, "f.py")


def test_only_files_with_work_and_bindings_are_generated(tmp_path):
    """A file with no TODO stays in solutions/ (benches run there, on any tree: common.course.bench), unless
    the stubs need it: __init__.py, binding.cpp, the loader that builds the stage's CUDA sources."""
    from common.course.make_stubs import generated
    stage = tmp_path / "a09_x"
    stage.mkdir()
    (stage / "__init__.py").write_text("")
    (stage / "binding.cpp").write_text("// the op's schema\n")
    (stage / "kernel.py").write_text(PY)
    (stage / "loader.py").write_text("from common.cuda_ext import load_op\n")
    (stage / "bench.py").write_text("from solutions.a09_x.kernel import f\n")
    (stage / "README.md").write_text("notes\n")
    got = {p.as_posix() for p in generated(tmp_path)}
    assert got == {"a09_x/__init__.py", "a09_x/binding.cpp", "a09_x/kernel.py", "a09_x/loader.py"}


def test_assignments_hold_no_file_without_a_todo_but_bindings():
    """A file in assignments/ has a TODO, is a binding or loader, or is a given module another one
    imports from its stage (stage 8's sampling.py: the engine stub must import)."""
    from common.course.make_stubs import BINDINGS, LOADER, RELATIVE, START, TARGET
    files = [p for p in sorted(TARGET.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    imported = {p.parent / f"{name}.py" for p in files if p.suffix == ".py" for name in RELATIVE.findall(p.read_text())}
    idle = [str(p.relative_to(TARGET)) for p in files
            if p.suffix in (".py", ".cu", ".cuh", ".cpp", ".h", ".toml")
            and p.name not in BINDINGS and not LOADER.search(p.read_text()) and p not in imported
            and not any(START.match(line) for line in p.read_text().splitlines())]
    assert not idle, f"files in assignments/ with nothing to do: {idle}"
