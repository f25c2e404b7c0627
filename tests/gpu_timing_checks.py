"""GPU checks of the grader's fresh-input timing (common.timing.bench_fresh), each run by
tests/test_grader.py in a process of its own."""
import torch


def a08_perf_case_replays_in_a_graph():
    from common.impl import load
    from common.course.stages import _a08_perf, by_key
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


def side_stream_work_is_found_and_counted():
    """A matmul forked onto a private stream: never joined back, the timing finds it (the output read on
    the caller's stream right after the call, or the graph capture's "unjoined work") and measures
    nothing; joined back, it is captured and timed like the same matmul on the caller's stream, and so
    it is when it refuses capture and is timed eagerly (each time ending after a device-wide
    synchronize): its side-stream matmul counts, never free."""
    import statistics

    from common.timing import bench_fresh, left_unjoined

    def inputs(g):
        return {"a": torch.randn(4096, 4096, device="cuda", generator=g),
                "b": torch.randn(4096, 4096, device="cuda", generator=g)}

    def honest(i):
        return i["a"] @ i["b"]
    side = torch.cuda.Stream()

    def on_side(i, join: bool):
        out = torch.empty(4096, 4096, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.mm(i["a"], i["b"], out=out)
        if join:
            torch.cuda.current_stream().wait_stream(side)
        return out

    def unjoined(i):
        return on_side(i, False)

    def joined(i):
        return on_side(i, True)

    def eager_side(i):                   # refuses capture, so it is timed eagerly; joins only if capturing
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("not capturable")
        return on_side(i, True)
    g = torch.Generator(device="cuda").manual_seed(0)
    # new inputs on every probe: the allocator may hand back a buffer holding an earlier call's answer
    assert left_unjoined(lambda: honest(inputs(g))) is None
    assert left_unjoined(lambda: joined(inputs(g))) is None
    assert left_unjoined(lambda: unjoined(inputs(g))) is not None, "an unjoined matmul of 4096^3 was not seen"
    t = bench_fresh(inputs, unjoined, honest, max_calls=40)
    assert t.unjoined and not t.ms, t
    t = bench_fresh(inputs, joined, honest, max_calls=40)
    assert not t.unjoined and t.how == "cuda-graph replay" and max(t.errors) < 1e-3, t
    t = bench_fresh(inputs, eager_side, honest, max_calls=40)
    assert not t.unjoined and t.how.startswith("eager") and max(t.errors) < 1e-3, t
    ratio = statistics.median(t.baseline_ms) / statistics.median(t.ms)
    assert ratio < 1.5, f"the eager side-stream matmul timed at {ratio:.2f}x the baseline: its work was not counted"
