"""Small Triton helpers the course's kernels share (given code)."""
import triton
import triton.language as tl


@triton.jit
def dim_mask(SIZE: tl.constexpr, BLOCK: tl.constexpr):
    """The [BLOCK] mask ``arange(0, BLOCK) < SIZE`` of a dimension padded to a power of two (a head
    size of 80 in a 128-wide block). Where SIZE == BLOCK it is the constant True, which Triton folds
    away: the loads and stores it masks compile as unmasked ones (a compare against SIZE would not)."""
    if SIZE == BLOCK:
        return tl.full([BLOCK], 1, tl.int1)
    else:
        return tl.arange(0, BLOCK) < SIZE
