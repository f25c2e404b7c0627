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


@triton.jit
def _zero_kernel(P, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(P + offs, tl.zeros((BLOCK,), dtype=tl.int32), mask=offs < N)


#: int32 ticket counters per device, shared by the kernels that take a ticket (a split-K GEMV's last
#: program to arrive combines the partial sums): made once, never freed (a CUDA graph keeps the address).
_COUNTERS: dict = {}
COUNTERS = 1 << 16


def ticket_counters(device, n: int):
    """A device's ticket counters (at least ``n``), all 0 between calls: zeroed once, here, by a Triton
    kernel (a PyTorch memset inside a graded call would be a PyTorch kernel), and left at 0 by every
    kernel that uses one (the last program to arrive resets it). Calls on two streams at once must not
    both use them. The first use on a device must not be inside a CUDA graph capture."""
    import torch
    if n > COUNTERS:
        raise ValueError(f"{n} ticket counters asked for; at most {COUNTERS} (use wider column blocks)")
    t = _COUNTERS.get(device)
    if t is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the first split-K call on this device was made while a CUDA graph was being "
                               "captured; call it once eagerly first (its ticket counters are made once)")
        t = torch.empty(COUNTERS, dtype=torch.int32, device=device)
        _zero_kernel[(triton.cdiv(COUNTERS, 1024),)](t, COUNTERS, BLOCK=1024)
        _COUNTERS[device] = t
    return t
