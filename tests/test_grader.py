"""The grader itself (not graded): its report, its Gradescope output, and that it
cannot be fooled by a submission that cheats, patches torch, crashes or hangs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from common import HAS_CUDA
from common.impl import REPO

GRADE = [sys.executable, "-m", "common.course.grade"]
# Each of these grades a whole tree in subprocesses (10-75 s apiece on a GPU, where timing runs):
# a slow course self-check like the mutation checks, so it runs with --mutants (make test, CI)
# and a plain `pytest` on a GPU machine leaves it out. The unmarked tests here are fast.
SELF_CHECK = pytest.mark.mutants


def _submission(tmp_path, edits: dict[str, list[tuple[str, str]]]):
    sub = tmp_path / "sub"
    shutil.copytree(REPO / "solutions", sub, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, pairs in edits.items():
        p = sub / rel
        text = p.read_text()
        for old, new in pairs:
            assert text.count(old) == 1, (rel, old)
            text = text.replace(old, new)
        p.write_text(text)
    return sub


def _grade(impl, tmp_path, stages, *extra, timeout=600):
    out = tmp_path / "report.json"
    rj = tmp_path / "results.json"
    r = subprocess.run([*GRADE, "--impl", str(impl), "--stages", stages, "--json-out", str(out),
                        "--results-json", str(rj), "--quiet", *extra], cwd=REPO, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(out.read_text()), json.loads(rj.read_text()), r.stdout


def _validate_gradescope(doc: dict) -> None:
    """The fields and types of Gradescope's results.json specification."""
    assert isinstance(doc.get("score", 0), (int, float))
    assert isinstance(doc.get("execution_time", 0), (int, float))
    assert doc.get("visibility", "visible") in ("hidden", "after_due_date", "after_published", "visible")
    assert doc.get("stdout_visibility", "visible") in ("hidden", "after_due_date", "after_published", "visible")
    assert isinstance(doc["tests"], list) and doc["tests"]
    for t in doc["tests"]:
        assert set(t) <= {"score", "max_score", "status", "name", "name_format", "number", "output",
                          "output_format", "tags", "visibility", "extra_data"}, set(t)
        assert isinstance(t["name"], str) and isinstance(t["output"], str)
        assert isinstance(t["score"], (int, float)) and isinstance(t["max_score"], (int, float))
        assert 0 <= t["score"] <= t["max_score"]
        assert t["status"] in ("passed", "failed")
        assert t.get("visibility", "visible") in ("hidden", "after_due_date", "after_published", "visible")
    for row in doc.get("leaderboard", []):
        assert isinstance(row["name"], str) and isinstance(row["value"], (int, float, str))


@SELF_CHECK
def test_solutions_full_marks_and_gradescope_format(tmp_path):
    report, gs, table = _grade("solutions", tmp_path, "a01,a02,a03")
    _validate_gradescope(gs)
    assert all(s["correctness"].startswith("pass") for s in report["stages"]), table
    if not torch.cuda.is_available():       # a01's transfer_report runs on a GPU only: not a plain pass here
        assert report["stages"][0]["correctness"] == "pass on CPU" and "GPU checks not run" in table, table
        assert "of what a CPU can check" in table and report["max"] < 30, table
    assert all(s["score"] == s["max_score"] for s in report["stages"]), table
    assert "a03_fused_linear" in table and "total" in table


@SELF_CHECK
def test_stubs_fail_without_crashing(tmp_path):
    report, gs, table = _grade("assignments", tmp_path, "a01,a02")
    _validate_gradescope(gs)
    assert all(s["correctness"] == "fail" and s["score"] == 0 for s in report["stages"]), table
    assert "NotImplementedError" in table
    rows = [ln for ln in table.splitlines() if ln.startswith(("a01_", "a02_"))]
    assert len(rows) == 2 and all(ln.endswith("not implemented yet") for ln in rows), table


@SELF_CHECK
def test_unwritten_output_is_not_implemented(tmp_path):
    """A stub that launches a kernel which writes nothing: its torch.empty output is NaN-filled
    in the trials, so the note says "not implemented yet", not "relative error inf"."""
    report, _, table = _grade("assignments", tmp_path, "a05", "--no-tests")
    st = report["stages"][0]
    assert st["score"] == 0 and st["not_implemented"], table
    assert "never written" in st["not_implemented"][0] and "relative error inf" not in table, table
    assert "not implemented yet" in table, table


def test_cpu_table_has_no_timing_columns():
    """No timing anywhere (a CPU-only machine): no empty timing columns, one line saying why,
    and the table fits the width it is given (long notes cut, in full under the table)."""
    from common.course.grade import StageResult, table
    rs = [StageResult("a01_roundtrip_linear", "x", tests_passed=16, trials_passed=3, trials_total=3,
                      correctness="pass", score=10, perf_note="needs a GPU"),
          StageResult("a03_fused_linear", "y", tests_failed=82, trials_total=7, perf_note="needs a GPU",
                      not_implemented=["NotImplementedError: a03: implement FusedLinear.forward"]),
          StageResult("a02_pretransposed_linear", "z", tests_passed=27, tests_failed=1, trials_passed=4,
                      trials_total=4, correctness="partial", score=9.82, message="x" * 300)]
    text = table(rs, "sub", "none", width=110)
    head = text.splitlines()[1].split()
    assert head[:2] == ["stage", "correct"] and not {"ms", "speedup", "roofline", "kernels", "H<->D"} & set(head), text
    assert text.count("timing needs a GPU") == 1, text
    assert all(len(ln) <= 110 for ln in text.splitlines()[:7]), text
    assert "not implemented yet" in text and "x" * 300 in text and "partial" in text, text


@SELF_CHECK
def test_failed_test_is_not_a_pass(tmp_path):
    """A wrong answer in a01's answers.toml: every trial passes (they grade the counter), a test fails.
    The score is 5 x (tests passed / run) + 5 and the label says "partial", not "pass"."""
    sub = _submission(tmp_path, {"a01_roundtrip_linear/answers.toml": [
        ("transfers_with_bias = 4\n", "transfers_with_bias = 3\n")]})
    report, _, table = _grade(sub, tmp_path, "a01")
    st = report["stages"][0]
    assert st["tests_failed"] == 1 and st["trials_passed"] == st["trials_total"], table
    ran = st["tests_passed"] + st["tests_failed"]
    share = 1.0 if torch.cuda.is_available() else ran / (ran + st["tests_skipped"])    # a CPU: what it ran
    assert st["correctness"].startswith("partial") and st["score"] == round((5 * (ran - 1) / ran + 5) * share, 2), \
        table


@SELF_CHECK
def test_weight_copied_per_call_is_caught_by_the_trials(tmp_path):
    """A FusedLinear that copies its weight on every call computes the right values: a test sees the
    copy (an extra aten.clone), and so do the grader's trials alone (common.kernel_check.input_copies)."""
    sub = _submission(tmp_path, {"a03_fused_linear/fused_linear.py": [
        ("        w = weight.t()", "        w = weight.clone().t()")]})
    report, _, table = _grade(sub, tmp_path, "a03", "--no-tests")
    (st,) = report["stages"]
    assert st["correctness"] == "fail" and st["score"] == 0, table
    assert "copied an input on every call" in st["message"] and "aten.clone" in st["message"], table


@SELF_CHECK
def test_calling_the_torch_op_is_caught(tmp_path):
    """A bias 'kernel' that is really torch arithmetic passes the values but not the grader."""
    sub = _submission(tmp_path, {"a03_fused_linear/add_bias.py": [(
        "    _check(y, b)\n    N = y.shape[-1]\n    # empty_like",
        "    _check(y, b)\n    return y + b\n    N = y.shape[-1]\n    # empty_like")]})
    report, _, table = _grade(sub, tmp_path, "a03", "--no-tests")
    (st,) = report["stages"]
    assert st["score"] == 0 and any("aten.add" in v for v in st["violations"]), table


@SELF_CHECK
def test_patching_torch_is_caught(tmp_path):
    sub = _submission(tmp_path, {"a02_pretransposed_linear/pretransposed_linear.py": [(
        "from torch import nn\n", "from torch import nn\n\ntorch.matmul = torch.matmul.__call__\n")]})
    report, _, table = _grade(sub, tmp_path, "a02", "--no-tests")
    (st,) = report["stages"]
    assert st["score"] == 0 and any("torch.matmul" in v for v in st["violations"]), table


@SELF_CHECK
def test_hard_coded_output_is_caught(tmp_path):
    """Outputs cached from one input fail on the grader's fresh inputs and shapes."""
    sub = _submission(tmp_path, {"a02_pretransposed_linear/pretransposed_linear.py": [(
        "        y = x @ self.weight_t\n",
        "        global _CACHE\n        _CACHE = globals().get('_CACHE') or (x @ self.weight_t)\n        y = _CACHE\n")]})
    report, _, table = _grade(sub, tmp_path, "a02", "--no-tests")
    assert report["stages"][0]["correctness"] == "fail", table


@SELF_CHECK
def test_outputs_memoised_per_shape_are_caught(tmp_path):
    """A cache keyed by shape never hits on fresh shapes: each stage's trials end with the shapes of
    an earlier trial again and new values, so the grader alone (no tests) rejects it."""
    sub = _submission(tmp_path, {"a02_pretransposed_linear/pretransposed_linear.py": [(
        "        y = x @ self.weight_t\n",
        "        memo = globals().setdefault('_MEMO', {})\n        key = (tuple(x.shape), x.dtype)\n"
        "        y = memo[key] if key in memo else memo.setdefault(key, x @ self.weight_t)\n")]})
    report, _, table = _grade(sub, tmp_path, "a02", "--no-tests")
    (st,) = report["stages"]
    assert st["correctness"] == "fail" and st["score"] == 0, table
    assert "the shapes of an earlier trial again" in st["message"], st["message"]


def test_trials_repeat_shapes_draw_fp32_gelu_and_long_k():
    """What the trials are made of (built, not run): every dtype for each kernel, whatever the draw;
    every stage with tensor trials repeats an
    earlier trial's shapes, the GELU stages always draw fp32 (only its 1e-5 tells the erf GELU from
    the tanh GELU), the matmul stage draws long K against torch.matmul's own error, and stage 7a
    has a one-tile-at-a-time trial, 7b long Nk against SDPA's own error; each trial carries the
    Forbidden of common.kernel_check."""
    import random

    from common import kernel_check
    from common.course.stages import by_key
    from common.testing import REL_TOL

    def trials(key):
        return by_key(key).trials(random.Random(7))
    for key in ("a02", "a03", "a05", "a06", "a07"):
        names = [t.name for t in trials(key)]
        assert any("the shapes of an earlier trial again" in n for n in names), (key, names)
    # every dtype, whatever the draw: a fault in one dtype's path is not let through by the luck of a
    # random pick (common.course.stages.DTYPE_CYCLE)
    dtypes = {"torch.float32", "torch.bfloat16", "torch.float16"}
    for key, kernels in (("a02", ("Pretransposed",)), ("a03", ("add_bias", "FusedLinear(addmm)", "FusedLinear(triton)")),
                         ("a05", ("gelu",)), ("a08", ("decode_attention", "add_layernorm", "layernorm (no residual)", "gemv"))):
        for seed in (1, 2):
            names = [t.name for t in by_key(key).trials(random.Random(seed))]
            for kernel in kernels:
                drawn = {d for n in names if kernel in n for d in dtypes if d in n}
                assert dtypes <= drawn, (key, kernel, names)
    gelu = trials("a05")
    assert sum("torch.float32" in t.name for t in gelu) >= 2 and all(t.forbid == kernel_check.GELU_KERNEL for t in gelu)
    long_k = [t for t in trials("a06") if "long K" in t.name]
    assert long_k and all(t.tol < REL_TOL[torch.bfloat16] for t in long_k), [(t.name, t.tol) for t in long_k]
    assert all(t.forbid == kernel_check.MATMUL_KERNEL for t in trials("a06"))
    no_tf32 = [t for t in trials("a06") if "allow_tf32=False" in t.name]     # fp32 without TF32: fp32's tolerance
    assert no_tf32 and all(t.tol == REL_TOL[torch.float32] and t.args["allow_tf32"] is False for t in no_tf32)
    a07 = trials("a07")
    assert any("one tile at a time" in t.name for t in a07)
    lse16 = [t for t in a07 if "one tile at a time" in t.name and "bfloat16" in t.name]   # 7a's L is fp32
    assert lse16 and all(t.dtypes[1] == torch.float32 for t in lse16)
    assert {t.forbid for t in a07} == {kernel_check.ATTENTION_TILED, kernel_check.ATTENTION_KERNEL}
    long_o = [t for t in a07 if "fwd O, long Nk" in t.name]    # Triton's O against SDPA's own error
    assert long_o and all(t.tol < REL_TOL[torch.bfloat16] for t in long_o), [(t.name, t.tol) for t in long_o]
    assert any("dQ dK dV, long Nk" in t.name for t in a07)


@SELF_CHECK
def test_crash_and_hang_fail_only_their_stage(tmp_path):
    sub = _submission(tmp_path, {
        "a02_pretransposed_linear/pretransposed_linear.py": [("import torch\n", "import os\nimport torch\nos._exit(3)\n")],
        "a03_fused_linear/fused_linear.py": [("import torch\n", "import time\nimport torch\ntime.sleep(600)\n")],
    })
    report, gs, table = _grade(sub, tmp_path, "a01,a02,a03", "--no-tests", "--timeout", "30")
    _validate_gradescope(gs)
    a01, a02, a03 = report["stages"]
    assert a01["correctness"] == "pass", table      # --no-tests: the trials alone, all on the CPU
    assert a02["correctness"] == "fail" and "crashed" in a02["message"], table
    assert a03["correctness"] == "fail" and "timed out" in a03["message"], table
    assert a02["score"] == a03["score"] == 0 and a01["score"] == a01["max_score"], table  # trials alone carry the score


@SELF_CHECK
def test_a_crashing_test_is_named(tmp_path):
    """A test that kills pytest (an abort, a segfault in an extension) is reported by name and signal."""
    sub = _submission(tmp_path, {"a03_fused_linear/add_bias.py": [
        ("    out = torch.empty_like(y) if y.is_contiguous() else",
         "    __import__('os').abort()\n    out = torch.empty_like(y) if y.is_contiguous() else")]})
    report, gs, table = _grade(sub, tmp_path, "a03", "--timeout", "120")
    _validate_gradescope(gs)
    msg = report["stages"][0]["message"]
    assert "tests crashed with SIGABRT (signal 6) while running tests/test_a03_fused_linear.py::test_add_bias" in msg, table
    assert msg.startswith("crashed with SIGABRT (signal 6)"), table      # the grader's own trials too


@SELF_CHECK
@pytest.mark.parametrize("flag", ["--json"])
def test_json_output(tmp_path, flag):
    r = subprocess.run([*GRADE, "--impl", "solutions", "--stages", "a01", flag, "--no-tests"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    doc = json.loads(r.stdout)
    assert doc["stages"][0]["stage"] == "a01_roundtrip_linear" and doc["total"] == doc["max"]


def test_plots_from_gpu_numbers(tmp_path):
    """speedup.png and roofline.png from a report's numbers (as a GPU run fills them)."""
    from common.course.grade import StageResult, plots, table
    ceil = {"gbps": 3000.0, "tflops": 750.0, "source": "test"}
    rs = [StageResult("a03_fused_linear", "x", ms=0.23, baseline_ms=0.24, speedup=1.04, flops=1.6e11, bytes=2.6e8,
                      ceilings=ceil, bound="compute", roofline_fraction=0.99),
          StageResult("a05_triton_gelu", "y", ms=0.095, baseline_ms=0.094, speedup=0.99, flops=5.4e8, bytes=2.7e8,
                      ceilings=ceil, bound="memory", roofline_fraction=0.95)]
    text = table(rs, "solutions", "test GPU", width=200)
    assert "timing needs a GPU" not in text and "speedup" in text, text
    assert "696 TFLOP/s" in text and "2842 GB/s" in text and "95% mem" in text, text  # achieved rate per bound
    paths = plots(rs, tmp_path)
    assert [p.name for p in paths] == ["speedup.png", "roofline.png"]
    assert all(p.stat().st_size > 5000 for p in paths)
    assert plots([StageResult("a01_roundtrip_linear", "z")], tmp_path / "none") == []  # no GPU numbers, no plots


@SELF_CHECK
def test_many_submissions(tmp_path):
    """An instructor's batch: one results.json per submission, graded in parallel."""
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copytree(REPO / "solutions", subs / "alice", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "assignments", subs / "bob", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "graded"
    r = subprocess.run([*GRADE, "--submissions", str(subs), "--out", str(out), "--jobs", "2", "--stages", "a01",
                        "--no-tests"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    alice = json.loads((out / "alice" / "results.json").read_text())
    bob = json.loads((out / "bob" / "results.json").read_text())
    _validate_gradescope(alice)
    _validate_gradescope(bob)
    assert alice["score"] == 10 and bob["score"] == 0, (alice, bob)


#: What a malicious submission tries at import (a01's module), reporting what worked by failing with it.
SNOOP = """
import os as _os
_leaks = []
try:
    _leaks.append('read ' + open({alice!r}).read(40))
except OSError:
    pass
for _p in ({course_test!r}, {alice!r}):
    try:
        open(_p, 'a').close()          # opened for writing (writes nothing)
        _leaks.append('could write ' + _p)
    except OSError:
        pass
for _d in ({subs!r}, _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.dirname(__file__))))):
    try:
        _leaks += ['saw ' + n for n in _os.listdir(_d) if n not in ('mallory', 'impl', 'tmp', 'home', 'cache')]
    except OSError:
        pass
if _leaks:
    raise RuntimeError('LEAK: ' + '; '.join(_leaks))
"""


@SELF_CHECK
def test_batch_keeps_submissions_apart(tmp_path):
    """--submissions grades each submission in a sandbox: a submission that tries to read another one,
    list the others, or open the course's tests or another submission for writing, gets nowhere (and
    is graded as usual); without the sandbox the same code does read the other submission."""
    from common.course.grade.batch import sandbox_available
    if sandbox_available():
        pytest.skip(sandbox_available())
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copytree(REPO / "solutions", subs / "alice", ignore=shutil.ignore_patterns("__pycache__"))
    alice = subs / "alice" / "a01_roundtrip_linear" / "roundtrip_linear.py"
    course_test = REPO / "tests" / "test_a01_roundtrip_linear.py"
    before = (alice.read_bytes(), course_test.read_bytes())
    mallory = _submission(tmp_path, {"a01_roundtrip_linear/roundtrip_linear.py": [(
        "from torch.utils._python_dispatch import TorchDispatchMode\n",
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        + SNOOP.format(alice=str(alice), course_test=str(course_test), subs=str(subs)))]})
    shutil.move(str(mallory), str(subs / "mallory"))
    for sandbox, out in ((True, tmp_path / "graded"), (False, tmp_path / "open")):
        r = subprocess.run([*GRADE, "--submissions", str(subs), "--out", str(out), "--jobs", "2", "--stages", "a01",
                            "--no-tests", *([] if sandbox else ["--no-sandbox"])], cwd=REPO, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        report = json.loads((out / "mallory" / "report.json").read_text())
        text = json.dumps(report)
        if sandbox:
            assert "LEAK" not in text and report["total"] == report["max"], text[-2000:]
            assert "(sandboxed)" in r.stdout, r.stdout
        else:                                   # the control: the same code reads alice's file
            assert "LEAK: read" in text, text[-2000:]
    assert (alice.read_bytes(), course_test.read_bytes()) == before


@pytest.mark.gpu
def test_graph_timing_checks_what_it_times():
    """The grader times CUDA-graph replays and checks the replayed output: a call that does
    its work only when not being captured (so the timed graph is empty) must fail."""
    from common.timing import bench_graph
    x = torch.randn(1 << 20, device="cuda")
    expected = x * 2

    def check(out):
        assert torch.equal(out, expected), "the replayed call did not produce the output"
    assert bench_graph(lambda: x * 2, check=check).median_ms > 0

    def idle_when_captured():
        return torch.empty_like(x) if torch.cuda.is_current_stream_capturing() else x * 2
    with pytest.raises(AssertionError, match="did not produce"):
        bench_graph(idle_when_captured, check=check)
    cached = expected.clone()
    with pytest.raises(AssertionError, match="did not produce"):
        bench_graph(lambda: cached, check=check)


@SELF_CHECK
def test_a08_trials_pass_the_solution_and_fail_the_stubs(tmp_path):
    """Stage 8's trials (kernels against float64, the engine against transformers) on fresh draws."""
    report, _, table = _grade("solutions", tmp_path, "a08", "--no-tests")
    (st,) = report["stages"]
    assert st["correctness"] == "pass" and st["trials_passed"] == st["trials_total"] >= 7, table
    report, _, table = _grade("assignments", tmp_path, "a08", "--no-tests")
    (st,) = report["stages"]
    assert st["correctness"] == "fail" and st["trials_passed"] == 0 and st["score"] == 0, table


def _a08_tiny_case(device, dtype, tol):
    from common.impl import load
    from common.course.stages import a08_decode_case
    cfg = dict(vocab_size=257, n_positions=64, n_embd=64, n_layer=2, n_head=2, initializer_range=0.3)
    return a08_decode_case(lambda m: load(m, "solutions"), cfg, batch=2, ctx=9, dtype=dtype, device=device, tol=tol)


def test_a08_perf_calls_are_idempotent_and_agree():
    """The timed calls of stage 8 (the engine's decode step, transformers' static-cache step) give
    the same logits call after call on the same input, as graph replay needs, the same logits as
    each other, and other logits on another input set (each timed call gets fresh tokens)."""
    from common.checks import kernel_device
    from common.testing import rel_error
    dev = kernel_device()          # the interpreter on a CPU, the GPU where there is one
    if dev == "cpu":               # fp32, bit for bit
        p, same = _a08_tiny_case(dev, torch.float32, 1e-5), torch.equal
    else:                          # bf16 on a GPU: the same within far less than the tolerance
        p, same = _a08_tiny_case(dev, torch.bfloat16, 6e-2), lambda x, y: rel_error(x, y) <= 1e-3
    g = torch.Generator(device=dev).manual_seed(1)
    inp, other = p.inputs(g), p.inputs(g)
    assert not torch.equal(inp["tok"], other["tok"])
    base, sub = p.baseline(inp).clone(), p.submission(inp).clone()
    assert same(p.baseline(inp), base) and same(p.submission(inp), sub), "a timed call is not idempotent"
    assert rel_error(sub, base) <= p.tol, f"engine and transformers differ by {rel_error(sub, base):.2e}"
    assert rel_error(p.submission(other), p.baseline(other)) <= p.tol
    assert rel_error(p.submission(other), sub) > p.tol, "the logits do not depend on the new token"
    assert p.flops > 0 and p.bytes > 0


def _in_a_fresh_process(check: str) -> None:
    """Run ``tests/gpu_timing_checks.py``'s ``check`` in a process of its own: bench_fresh captures and
    destroys several CUDA graphs, and on the H100 GPU tests run after it in the same process failed
    (cause not established); the grader times in a process of its own too."""
    r = subprocess.run([sys.executable, "-c", f"import gpu_timing_checks as c; c.{check}()"], cwd=REPO,
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])})
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


@pytest.mark.gpu
def test_a08_perf_case_replays_in_a_graph():
    """GPT-2 small's decode step, engine and transformers, captured and replayed on fresh tokens as the
    grader times them: every timed call's logits within the stage's tolerance of transformers'."""
    _in_a_fresh_process("a08_perf_case_replays_in_a_graph")


@pytest.mark.gpu
def test_fresh_timing_catches_what_graph_timing_let_through():
    """The timing exploits that scored full marks against one input replayed (a CUDA graph that copies
    a result recorded during capture, outputs memoised by the input's address, a call that cannot be
    captured and returns a cached tensor eagerly): with fresh values before every timed call, each
    of their timed outputs is wrong, and an honest call's are right."""
    _in_a_fresh_process("fresh_timing_catches_exploits")


@pytest.mark.gpu
def test_side_stream_work_is_found_and_counted():
    """Work forked onto a private stream: never joined back, the timing finds it and measures nothing;
    joined back, it is timed as the same work on the caller's stream; timed eagerly, it counts."""
    _in_a_fresh_process("side_stream_work_is_found_and_counted")


def test_speed_score_is_the_geometric_mean_over_shapes():
    """A stage timed at several shapes is scored by the geometric mean of its per-shape speedups
    (worker.summarize, pure): 2x faster on one shape and 2x slower on another scores as 1x, not as
    the ratio of the summed times; the per-shape numbers stay in the result (``cases``)."""
    import math

    from common.course.grade.score import PERF_POINTS, combined_speedup, score
    from common.course.grade.judge import summarize
    from common.course.grade.result import WorkerResult
    ceil = {"gbps": 3000.0, "tflops": 750.0, "source": "test"}

    def case(label, ms, base):
        return dict(label=label, ms=ms, baseline_ms=base, flops=1e12, bytes=1e8, timing="cuda-graph replay",
                    kernels_per_call=1, host_transfers_per_call=0)
    cases = [case("big", 1.0, 2.0), case("odd", 0.1, 0.05), case("small", 0.02, 0.016)]
    got = summarize(cases, ceil)
    want = math.exp((math.log(2.0) + math.log(0.5) + math.log(0.8)) / 3)
    assert got["speedup"] == pytest.approx(want) == pytest.approx(combined_speedup([2.0, 0.5, 0.8]))
    assert got["speedup"] != pytest.approx((2.0 + 0.05 + 0.016) / 1.12)        # not the time-weighted ratio
    assert got["ms"] == pytest.approx(1.12) and got["baseline_ms"] == pytest.approx(2.066)
    assert [c["speedup"] for c in got["cases"]] == pytest.approx([2.0, 0.5, 0.8])
    assert got["perf_label"].startswith("geometric mean over 3 shapes") and "odd" in got["perf_label"]
    s = score(tests_passed=10, tests_failed=0, trials="pass", violations=False, run_tests=True, timed=True,
              speedup=got["speedup"], perf_target=0.8)
    assert s.score == round(10 + PERF_POINTS * min(1.0, want / 0.8), 2)
    # one shape: the old fields, the same numbers
    one = summarize(cases[:1], ceil)
    assert one["speedup"] == 2.0 and one["perf_label"] == "big" and len(one["cases"]) == 1
    # the per-shape detail survives the worker -> parent JSON and reaches the report's StageResult
    back = WorkerResult.from_json(WorkerResult(**got).to_json())
    assert back.cases == got["cases"] and back.speedup == pytest.approx(want)
    from dataclasses import fields

    from common.course.grade import StageResult
    assert {f.name for f in fields(WorkerResult)} <= {f.name for f in fields(StageResult)}
    from common.course.grade import gradescope
    r = StageResult("a06_matmul", "x", baseline="torch.matmul (cuBLAS)", score=s.score, max_score=s.max_score,
                    ceilings=ceil, perf_target=0.8, **got)
    out = gradescope([r], 1.0)["tests"][0]["output"]
    assert f"{want:.2f}x torch.matmul (cuBLAS), the geometric mean over 3 shapes" in out, out
    assert "odd: 0.1000 ms vs 0.0500 ms (0.50x)" in out, out
    with pytest.raises(ValueError):
        combined_speedup([])


def test_graded_speed_shapes_are_swept_by_the_benches():
    """Stages 6 and 7 are timed at shapes their benches' --shapes real sweeps cover (common/shapes.py),
    each at a GPT-2 shape and an unaligned one; the GELU stages at two shapes, one of odd size."""
    import math

    from common.course import stages
    from solutions.a06_matmul.bench import real_shapes
    from solutions.a07_flash_attention.bench import real_configs
    swept = {(m, k, n) for _, _, m, k, n, dtypes in real_shapes() if torch.bfloat16 in dtypes}
    assert {mkn for _, mkn in stages.A06_SHAPES} <= swept, stages.A06_SHAPES
    assert (8192, 768, 3072) in {mkn for _, mkn in stages.A06_SHAPES}
    assert any(any(x % 8 for x in mkn) for _, mkn in stages.A06_SHAPES)
    configs = {(b, h, s, d) for s, d, causal, b, h in real_configs() if causal}
    assert set(stages.A07_SHAPES) <= configs, stages.A07_SHAPES
    assert any(s % 16 for _, _, s, _ in stages.A07_SHAPES)
    assert len(stages.GELU_SHAPES) >= 2 and any(math.prod(sh) % 2 for sh in stages.GELU_SHAPES)


@SELF_CHECK
def test_stage_8_says_what_it_runs_on_and_borrows(tmp_path):
    """Stage 8 done on top of unfinished a06/a07: its engine tests say so (not "relative error inf"),
    and --borrow a06,a07 runs them on the reference a06 and a07."""
    sub = tmp_path / "sub"
    shutil.copytree(REPO / "assignments", sub, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(sub / "a08_gpt2_inference")
    shutil.copytree(REPO / "solutions" / "a08_gpt2_inference", sub / "a08_gpt2_inference",
                    ignore=shutil.ignore_patterns("__pycache__"))
    cmd = [sys.executable, "-m", "pytest", "tests/test_a08_gpt2_inference.py", "--impl", str(sub), "-q", "-x",
           "-p", "no:cacheprovider", "-k", "test_decode_logits and fp32"]
    env = {k: v for k, v in os.environ.items() if k != "COURSE_VIA_MAKE"}     # pytest's syntax, even under make test
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode != 0 and "stage 8 runs on your a06 matmul" in r.stdout and "--borrow a06,a07" in r.stdout, \
        r.stdout[-3000:]
    r = subprocess.run(cmd + ["--borrow", "a06,a07"], cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:]


def test_borrowed_stages_are_named_in_the_report():
    from common.course.grade import StageResult, gradescope, table
    r = StageResult("a08_gpt2_inference", "x", tests_passed=3, trials_passed=14, trials_total=14, correctness="pass",
                    score=10, borrowed=["a06", "a07"])
    assert "ran on a06, a07 borrowed from solutions/" in table([r], "sub", "none", width=200)
    assert "borrowed from solutions/ (--borrow)" in gradescope([r], 1.0)["tests"][0]["output"]


def test_judge_tells_a_partly_written_output_from_an_unwritten_one():
    """The judge's verdict on outputs still NaN where the worker's buffers were poisoned: wholly, "not
    implemented yet" (never written); partly, how many and where to look (the grid and the mask)."""
    import random

    from common.course.grade.judge import _judge
    from common.course.grade.result import WorkerResult
    from common.course.stages import by_key
    stage = by_key("a05")
    trials = stage.trials(random.Random(3))[:2]
    outs = []
    for n, t in enumerate(trials):
        o = t.ref.to(t.args["x"].dtype).clone()         # the dtype the trial expects
        if n == 0:
            o.fill_(float("nan"))                        # never written
        else:
            o.view(-1)[o.numel() // 2:] = float("nan")   # the second half never written
        outs.append([o])
    found = {"trials": [{"ops": [], "functions": [], "gpu_kernels": [], "facts": {}, "aliases": []} for _ in trials]}
    res = _judge(stage, trials, found, outs, WorkerResult(trials_total=len(trials)))
    assert res.correctness == "fail" and res.trials_passed == 0
    assert "the output was never written (still NaN)" in res.not_implemented[0], res
    assert "outputs never written (still NaN): check the grid and the mask" in res.message, res.message


def test_one_stage_name_everywhere(capsys):
    """a03, 3, 03, a3 and a03_fused_linear all name stage 3 (common.impl.stage_key, which make check,
    the grader's --stages, the benches and ncu read); any other name is an error listing the stages,
    never an empty selection (pytest would collect every test, the grader divide by zero)."""
    from common.course.grade.__main__ import main
    from common.impl import StageError, stage_key, stage_keys, stage_list
    for name in ("a03", "3", "03", "a3", "A03", " a03_fused_linear "):
        assert stage_key(name) == "a03", name
    assert stage_key("7c") == stage_key("a07c_flash_hopper") == "a07c"
    assert stage_key("a07_flash_attention") == "a07" and stage_list("3,a05,03") == ["a03", "a05"]
    assert set(stage_keys()) == {"a01", "a02", "a03", "a04", "a05", "a06", "a07", "a07c", "a08", "a09"}
    for bad in ("nonsense", "10", "a3x", "fused_linear", ""):
        with pytest.raises(StageError, match="Stages: a01, a02, a03, .*a08"):
            stage_list(bad)
    with pytest.raises(StageError, match="a07c is not one this command takes"):
        stage_key("a07c", ["a07", "a08"])
    assert main(["--stages", "3x"]) == 2
    assert capsys.readouterr().err.startswith("python -m common.course.grade: --stages '3x': no such stage. Stages: a01")
    # what the Makefile runs (no torch import): the test file for make check, exit 2 and the message otherwise
    cli = [sys.executable, "-P", "common/impl.py", "stage"]
    r = subprocess.run(cli + ["3", "check"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "tests/test_a03_fused_linear.py", r
    r = subprocess.run(cli + ["a3_fused", "check"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and not r.stdout and "STAGE='a3_fused': no such stage. Stages: a01" in r.stderr, r


def test_stage_8_dependency_hint_in_make_syntax(monkeypatch):
    """Stage 8 on unfinished a06 and a07: one sentence in plural grammar, naming the option as the
    run was started (make: BORROW=a06,a07)."""
    import types

    from common.course.stages import a08_dependencies

    def unwritten(*a, **k):
        raise NotImplementedError("stub")
    stub = types.SimpleNamespace(matmul=unwritten, attention_forward=unwritten)
    monkeypatch.setenv("COURSE_VIA_MAKE", "1")              # the Makefile exports it
    msg = a08_dependencies(lambda module: stub)
    assert "which are not implemented yet: finish them" in msg and "BORROW=a06,a07" in msg, msg
    assert "--borrow" not in msg, msg
    monkeypatch.delenv("COURSE_VIA_MAKE")
    msg = a08_dependencies(lambda module: stub)
    assert "--borrow a06,a07" in msg and "BORROW=" not in msg, msg
    assert "COURSE_VIA_MAKE" in (REPO / "Makefile").read_text()


def test_cpu_score_counts_only_what_ran():
    """On a CPU no points for work that did not run (score.score, pure): a stage with GPU-only tests
    counts for the share of its tests that ran, score and maximum alike, and is never a plain "pass";
    a stage whose trials need a GPU is ungraded, 0 / 0, whatever its CPU checks say."""
    from common.course.grade.score import CORRECT_POINTS, NEEDS_GPU, PASS, UNGRADED, score
    kw = dict(violations=False, run_tests=True, timed=False, speedup=None, perf_target=None)
    s = score(tests_passed=87, tests_failed=0, trials=PASS, tests_gpu_only=2, **kw)
    assert (s.correctness, s.score, s.max_score) == ("pass on CPU", 9.78, 9.78), s
    s = score(tests_passed=86, tests_failed=1, trials=PASS, tests_gpu_only=2, **kw)
    assert s.correctness == "partial on CPU" and s.score == round((5 * 86 / 87 + 5) * 87 / 89, 2) < s.max_score
    for passed, failed in ((12, 0), (11, 1), (0, 0)):          # a04 on a CPU: compile checks only
        s = score(tests_passed=passed, tests_failed=failed, trials=NEEDS_GPU, tests_gpu_only=47, **kw)
        assert (s.correctness, s.score, s.max_score) == (UNGRADED, 0, 0) and s.ungraded, s
    s = score(tests_passed=12, tests_failed=0, trials=PASS, **kw)              # everything ran: the full 10
    assert (s.correctness, s.score, s.max_score) == (PASS, CORRECT_POINTS, CORRECT_POINTS)
    s = score(tests_passed=12, tests_failed=0, trials=PASS, tests_gpu_only=3, violations=True, run_tests=True,
              timed=False, speedup=None, perf_target=None)
    assert s.correctness == "fail" and s.score == 0


def test_cpu_report_never_shows_full_marks_for_work_not_run():
    """The table's row and total and Gradescope's results say what a CPU could not check: "CPU checks
    pass; 47 GPU checks not run", "total ... of what a CPU can check; a04 ungraded"; an ungraded stage
    is never "passed" in Gradescope and its notes wrap at a readable width."""
    from common.course.grade import StageResult, gradescope, report_json, table
    from common.course.grade.run import cpu_note
    from common.course.grade.score import NEEDS_GPU, PASS, score
    kw = dict(violations=False, run_tests=True, timed=False, speedup=None, perf_target=None)
    rs = []
    for folder, p, gpu, trials in (("a03_fused_linear", 87, 2, PASS), ("a04_cuda_gelu", 12, 47, NEEDS_GPU),
                                   ("a05_triton_gelu", 40, 0, PASS)):
        s = score(tests_passed=p, tests_failed=0, trials=trials, tests_gpu_only=gpu, **kw)
        rs.append(StageResult(folder, "t", tests_passed=p, tests_skipped=gpu, correctness=s.correctness,
                              score=s.score, max_score=s.max_score, message=cpu_note(s, p, 0, gpu, True)))
    assert rs[0].message.startswith("CPU checks pass; 2 GPU checks not run")
    assert "CPU checks pass; 47 GPU checks not run" in rs[1].message and rs[1].message.startswith("ungraded")
    assert rs[2].message == ""
    text = table(rs, "sub", "none", width=120)
    assert "total 19.78 / 19.78 of what a CPU can check; a04 ungraded (needs a GPU)" in text, text
    row = next(ln for ln in text.splitlines() if ln.startswith("a04_cuda_gelu"))
    assert "ungraded" in row and "/" not in row.split("ungraded")[1].split()[2], row     # score column "-", not 0/0
    assert all(len(ln) <= 120 for ln in text.splitlines()), text
    gs = gradescope(rs, 1.0)
    _validate_gradescope(gs)
    a04 = gs["tests"][1]
    assert a04["status"] == "failed" and a04["score"] == a04["max_score"] == 0 and "ungraded" in a04["name"], a04
    assert "of what a CPU can check; a04 ungraded" in gs["output"], gs["output"]
    doc = report_json(rs, "sub", "none", 1.0)
    assert doc["ungraded"] == ["a04"] and doc["total"] == doc["max"] == 19.78
    exact = StageResult("a08_gpt2_inference", "t", worst_error=0.35, tolerance=0.0, trials_total=3)
    assert "3.5e-01 (exact)" in table([exact], "sub", "none") and "(tolerance exact)" in gradescope([exact], 1)[
        "tests"][0]["output"]
    # a failed stage whose maximum shrank: still "of what a CPU can check"
    s = score(tests_passed=0, tests_failed=22, trials="fail", tests_gpu_only=2, **kw)
    failed = StageResult("a01_roundtrip_linear", "t", tests_failed=22, tests_skipped=2, correctness=s.correctness,
                         score=s.score, max_score=s.max_score)
    assert table([failed], "sub", "none").splitlines()[4] == "total 0 / 9.17 of what a CPU can check"
    # everything ran (a GPU): no such words
    full = [StageResult("a05_triton_gelu", "t", correctness=PASS, score=15, max_score=15)]
    assert "CPU" not in table(full, "sub", "H100", width=120).splitlines()[-1]
    assert "without a GPU" not in gradescope(full, 1.0)["output"]


@SELF_CHECK
def test_wrong_cuda_gelu_earns_nothing(tmp_path):
    """A CUDA GELU that returns its input compiles and passes a CPU's compile checks: graded on a CPU,
    stage 4 is ungraded (0 of 0, never 10/10); on a GPU its trials fail. Either way: no points."""
    sub = _submission(tmp_path, {"a04_cuda_gelu/gelu_kernel.cu": [
        ("  return 0.5f * x * (1.0f + tanhf(inner));", "  return x;")]})
    report, gs, table = _grade(sub, tmp_path, "4")
    st = report["stages"][0]
    assert st["score"] == 0 and gs["tests"][0]["status"] == "failed", table
    if not torch.cuda.is_available():
        assert st["correctness"] == "ungraded" and st["max_score"] == 0 and report["ungraded"] == ["a04"], table
        assert "a04 ungraded" in table and "10/10" not in table, table


def test_stage_test_ids_are_readable_and_the_mutant_hints_exist():
    """Stages 1-7 name their cases (test_add_bias[7x13-fp32], not [shape2-dtype0]), and every test
    tests/mutants/first_failures.json names for them is still collected under that id (on a CPU: the hints
    are the CPU mutation checks', and a GPU collects other cases)."""
    import re
    if HAS_CUDA:
        pytest.skip("the mutant hints name the CPU's cases; a GPU collects other ones")
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_a0[1-7]_*.py"))
    r = subprocess.run([sys.executable, "-m", "pytest", *files, "--collect-only", "-q", "-p", "no:cacheprovider"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    ids = [ln.strip() for ln in r.stdout.splitlines() if "::" in ln]
    assert len(ids) > 300, r.stdout[-2000:] + r.stderr[-2000:]
    opaque = [i for i in ids if re.search(r"[\[-](dtype|shape|lead|case)\d+[\]-]|torch\.|\(", i)]
    assert not opaque, opaque[:10]
    by_file = {}
    for i in ids:
        f, name = i.split("::", 1)
        by_file.setdefault(f.split("test_")[-1][:3], set()).add(name)
    hints = json.loads((REPO / "tests" / "mutants" / "first_failures.json").read_text())
    stale = [(k, v) for k, v in hints.items() if k[:3] in by_file and v not in by_file[k[:3]]
             and any(n.split("[")[0] == v.split("[")[0] for n in by_file[k[:3]])]
    assert not stale, stale
