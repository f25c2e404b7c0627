"""The host-cost bench (common.hostcost) and the launch helpers (common.launch) on a CPU (not graded).

The numbers are the GPU's (lectures/_tools/gpu/hostcost_run.sh); here: the helpers compute what Triton's do,
plain_eager sends every traced, fake or differentiable call through the registered op, and the bench's
stubbed mode runs a case and writes its table.
"""
from __future__ import annotations

import pytest
import torch
import triton

import common
from common import hostcost
from common.impl import Impl
from common.launch import cdiv, next_power_of_2, plain_eager
from common.profiling import trace_ops


def test_integer_helpers_match_triton():
    for n in (0, 1, 2, 3, 15, 16, 17, 1000, 4097):
        assert next_power_of_2(n) == triton.next_power_of_2(n)
        for b in (1, 16, 64):
            assert cdiv(n, b) == triton.cdiv(n, b)


def test_plain_eager_only_when_nothing_traces():
    x = torch.randn(4)
    assert plain_eager(x)
    assert not plain_eager(torch.randn(4, requires_grad=True))
    with torch.no_grad():
        assert plain_eager(torch.randn(4, requires_grad=True))
    with trace_ops():
        assert not plain_eager(x)
    assert not plain_eager(torch.nn.Parameter(torch.randn(4)))
    seen = []
    torch.compile(lambda t: (seen.append(plain_eager(t)), t + 1)[1], backend="eager", fullgraph=False)(x)
    assert seen == [False]


@pytest.mark.skipif(not common.TRITON_INTERPRET, reason="the stubbed mode needs the Triton interpreter")
def test_stubbed_bench_writes_its_table(tmp_path):
    rows = hostcost.run_cases(Impl.get("solutions"), ["a03_add_bias"], stub=True, log=lambda *a: None)
    assert [r["key"] for r in rows] == ["bare", "a03_add_bias"]
    assert all(r["course_us"] > 0 and r["torch_us"] > 0 for r in rows)
    hostcost.write(rows, tmp_path, "hc", "cmd", "CPU")
    assert "add_bias" in (tmp_path / "hc.md").read_text()
    assert hostcost.compare(tmp_path / "hc.csv", tmp_path / "hc.csv") == 0
