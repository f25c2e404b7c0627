"""The stubs in assignments/ are generated from solutions/ (common/make_stubs.py); not graded, CPU, fast."""
from __future__ import annotations

import pytest

from common.make_stubs import MarkerError, differences, stub_text


def test_committed_assignments_are_what_solutions_generate():
    """Byte for byte: edit solutions/ and run `python -m common.make_stubs`, never assignments/ by hand."""
    diff = differences()
    assert not diff, ("assignments/ differs from what solutions/ generates (run python -m common.make_stubs): "
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
