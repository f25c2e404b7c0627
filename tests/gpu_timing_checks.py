"""GPU checks of the grader's fresh-input timing (common.timing.bench_fresh), each run by
tests/test_grader.py in a process of its own."""
import torch


def a08_perf_case_replays_in_a_graph():
    from common.impl import load
    from common.stages import _a08_perf, by_key
    from common.timing import bench_fresh
    p = _a08_perf(lambda m: load(m, "solutions"))
    t = bench_fresh(p.inputs, p.submission, p.baseline, max_calls=40)
    assert t.how == "cuda-graph replay", t.how
    assert max(t.errors) <= by_key("a08").perf_tol, max(t.errors)
    assert min(t.ms) > 0 and min(t.baseline_ms) > 0


def fresh_timing_catches_exploits():
    from common.timing import bench_fresh

    def inputs(g):
        return {"a": torch.randn(256, 256, device="cuda", generator=g), "b": torch.randn(256, 256, device="cuda", generator=g)}

    def honest(i):
        return i["a"] @ i["b"]
    last = {}

    def copy_when_captured(i):           # during capture: replay a copy of the last eager result
        if torch.cuda.is_current_stream_capturing():
            return last["out"].clone()
        last["out"] = i["a"] @ i["b"]
        return last["out"]
    memo = {}

    def memo_by_address(i):
        key = (i["a"].data_ptr(), i["b"].data_ptr())
        if key not in memo:
            memo[key] = i["a"] @ i["b"]
        return memo[key]

    def no_capture_then_cache(i):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("not capturable")
        return memo_by_address(i)
    t = bench_fresh(inputs, honest, honest, max_calls=40)
    assert t.how == "cuda-graph replay" and max(t.errors) < 1e-5, t
    for cheat in (copy_when_captured, memo_by_address, no_capture_then_cache):
        memo.clear()
        t = bench_fresh(inputs, cheat, honest, max_calls=40)
        wrong = [e for e in t.errors if not e <= 1e-2]
        assert len(wrong) >= len(t.errors) - 3, (cheat.__name__, t.how, t.errors[:10])
    assert t.how.startswith("eager (graph capture failed")
