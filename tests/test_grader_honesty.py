"""The grader's checks that run without a GPU: work left on another stream (the verdict on what the
timing worker read), eager timing said in the stage's row, and no reference within the submission's
reach. The GPU side (common.timing.left_unjoined on a real call) is tests/test_a05_triton_gelu.py's
test_output_joined_to_the_callers_stream and the mutant 'kernel on a private stream' (tests/mutants/exploit.py)."""
from __future__ import annotations

import gc

import pytest
import torch

import common
from common.course.grade import judge
from common.course.grade.result import WorkerResult
from common.course.grade.score import FAIL, PASS
from common.impl import REPO
from common.course.stages import by_key
from common.timing import unjoined_difference


def test_unjoined_difference_is_none_for_equal_reads():
    a = torch.randn(5, 7)
    a[0, 0] = float("nan")                      # a NaN read twice is the same NaN
    assert unjoined_difference([a.clone(), torch.arange(4)], [a, torch.arange(4)]) is None


def test_unjoined_difference_names_what_differs():
    final = torch.randn(100)
    early = final.clone()
    early[60:] = float("nan")                   # the part the side stream had not written yet
    found = unjoined_difference([torch.zeros(3), early], [torch.zeros(3), final])
    assert found is not None and found.startswith("output 1: 40 of 100 elements"), found
    assert "never joined back" in found


def _case(how="cuda-graph replay", unjoined=""):
    return dict(label="gelu 8192x3072 bf16", baseline_name="F.gelu", flops=1.0, bytes=1.0, how=how,
                ms=[1.0, 1.0], baseline_ms=[1.0, 1.0], errors=[0.0, 0.0], eager_ms=None, baseline_eager_ms=None,
                kernels_per_call=1, host_transfers_per_call=0, unjoined=unjoined)


@pytest.fixture
def on_a_gpu(monkeypatch):
    """The judge's timing verdict as on a GPU machine (its measured ceilings stubbed)."""
    monkeypatch.setattr(common, "HAS_CUDA", True)
    monkeypatch.setattr(judge, "_ceilings", lambda: {"gbps": 3000.0, "tflops": 800.0, "source": "test"})


#: what the timing worker sends for a case where it found work left unjoined (it measures nothing more)
READ = dict(label="gelu 8192x3072 bf16", baseline_name="F.gelu", how="not timed: work left unjoined",
            unjoined="output 0: 9 of 9 elements read on the caller's stream right after the call differ")
CAPTURE = dict(READ, how="not timed (graph capture failed: RuntimeError: CUDA error: capturing stream has unjoined "
                         "work)", unjoined="graph capture failed: RuntimeError: CUDA error: capturing stream has "
                                          "unjoined work")


@pytest.mark.parametrize("timing", [
    {"error": None, "cases": [READ]}, {"error": None, "cases": [CAPTURE]},
    {"error": None, "cases": [_case(how="eager (graph capture failed: RuntimeError: capturing stream has unjoined "
                                        "work)")]},
    {"error": "RuntimeError: the device broke after it", "cases": [_case(), READ]}],
    ids=["read_right_after", "capture", "eager_after_an_unjoined_capture", "then_an_error"])
def test_work_left_unjoined_fails_the_stage(on_a_gpu, timing):
    res = judge._judge_timing(by_key("a05"), timing, WorkerResult(correctness=PASS))
    assert res.correctness == FAIL and res.speedup is None, res
    assert "never joined back" in res.message and "No speed points" in res.message, res.message


def test_eager_timing_is_said_in_the_row(on_a_gpu):
    case = _case(how="eager (graph capture failed: RuntimeError: no graphs here)")
    res = judge._judge_timing(by_key("a05"), {"error": None, "cases": [case]}, WorkerResult(correctness=PASS))
    assert res.correctness == PASS and res.speedup == pytest.approx(1.0)
    assert "timed eagerly, graph capture failed: RuntimeError: no graphs here" in res.message, res.message
    assert "torch.cuda.synchronize()" in res.message


def test_a_graph_replay_needs_no_note(on_a_gpu):
    res = judge._judge_timing(by_key("a05"), {"error": None, "cases": [_case()]}, WorkerResult(correctness=PASS))
    assert res.correctness == PASS and res.message == ""


@pytest.mark.parametrize("key", ["a02", "a03", "a05", "a06"])
def test_the_inputs_carry_no_answer(tmp_path, key):
    """What the judge hands the worker (trials.pt, as written and read back) holds the inputs alone: no
    float64 tensor, and no tensor that holds a trial's expected output in any dtype, so a submission that
    searches its process (gc, frames, module globals) finds no answer; the judge keeps the references."""
    import random

    from common.course.grade.worker import TRIALS
    from common.course.stages import tensors
    trials = by_key(key).trials(random.Random(5))
    torch.save({"trials": [{"name": t.name, "call": t.call, "args": t.args} for t in trials]}, tmp_path / TRIALS)
    loaded = torch.load(tmp_path / TRIALS, weights_only=True)["trials"]
    for t, sent in zip(trials, loaded):
        args = [v for v in sent["args"].values() if isinstance(v, torch.Tensor)]
        assert not [a for a in args if a.dtype == torch.float64], f"{t.name}: a float64 input"
        for ref in tensors(t.ref):
            same = [a for a in args if a.shape == ref.shape and a.is_floating_point()
                    and torch.allclose(a.double().cpu().nan_to_num(), ref.double().cpu().nan_to_num(), rtol=1e-2, atol=1e-3)]
            assert not same, f"{t.name}: an input holds the expected output"


def test_the_registry_is_complete_before_the_guard_looks():
    """The timing worker snapshots the harness, then resolves its stage: importing the registry must have
    loaded every stage module already, or their calls, added to CALLS later, read as a patch of the harness
    (every timed stage would be refused). In a fresh process, as the worker is."""
    import subprocess
    import sys
    code = ("from common.course.grade.worker import _import_harness; _import_harness()\n"
            "from common.course import guard\n"
            "from common.course.stages import by_key\n"
            "before = guard.snapshot()\n"
            "[by_key(k) for k in ('a01', 'a05', 'a08')]\n"
            "print('CHANGED', guard.changed(before))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert "CHANGED []" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
