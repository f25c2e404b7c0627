"""Portability: every Triton kernel the course ships fits the GPUs students have, not only the H100.

    python -m pytest tests/test_portability.py --impl solutions         # CPU is enough
    COURSE_PORTABILITY=full python -m pytest tests/test_portability.py --impl solutions   # + sm_75, fp16, ...

Triton compiles for a GPU that is not there (``common.course.portability``: ``triton.compile`` with an
explicit ``GPUTarget``, the ptxas Triton bundles, no driver). Every launch of stages 3, 5, 6, 7 and 8
is compiled the way its launcher makes it on each family of ``common.gpu.ARCHS`` (sm_90 H100/H200,
sm_80 A100, sm_86 RTX 30xx, sm_89 RTX 40xx, sm_75 T4): the dtypes and constexprs it is launched
with, every fixed config (with the fallback a launcher takes where it does not fit) and every
candidate the autotuners keep on that GPU, checked against the family's shared memory per block and
registers. The compile facts of earlier runs are in tests/data/portability_facts.json (keyed by
Triton's own cache key: a changed kernel, config or Triton compiles again); a few known ones are
compiled again every run and must match. Given code (the launchers' configs and fallbacks), so the
tests of an impl are marked ``given``: they pass on the untouched stubs too, and grade nothing. The
CUDA sources are compiled for the same families with nvcc (``nvcc``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from common.gpu import ARCHS
from common.impl import REPO

FULL = os.environ.get("COURSE_PORTABILITY", "quick") == "full"
#: Known kernels compiled again on every run, to check tests/data/portability_facts.json
VERIFY = int(os.environ.get("COURSE_PORTABILITY_VERIFY", "2"))



#: The families a test of this file reads (the rest: test_every_kernel_fits' own ``arch``, or all of them).
READS = {"test_h100_runs_its_tables_as_they_are": ("sm_90",)}


def _needed(session) -> tuple[list[str], bool]:
    """(the families the selected tests of this file read, whether the facts file is checked): a run of
    one test (the mutation checks run the one that caught a mutant first) compiles for its family only."""
    archs, verify = set(), False
    for item in session.items:
        if getattr(getattr(item, "module", None), "__name__", None) != __name__ or \
                "compiled" not in getattr(item, "fixturenames", ()):
            continue
        name = item.originalname
        verify |= name == "test_facts_file_says_what_the_compiler_says"
        params = getattr(getattr(item, "callspec", None), "params", {})
        archs |= {params["arch"]} if "arch" in params else set(READS.get(name, ARCHS))
    return [a for a in ARCHS if a in archs], verify


@pytest.fixture(scope="module")
def compiled(request, impl, tmp_path_factory):
    """(results per arch, the command's summary line and mismatches, seconds): every launch of ``impl``
    cross-compiled (common.course.portability, in a process with the Triton interpreter off) for the
    families the selected tests read (_needed; all of them in a run of the whole file)."""
    pytest.importorskip("triton")
    archs, verify = _needed(request.session)
    out = tmp_path_factory.mktemp("portability") / "results.json"
    cmd = [sys.executable, "-m", "common.course.portability", "--impl", str(impl.root), "--json", str(out), "-q",
           "--archs", ",".join(archs or ARCHS), "--verify", str(VERIFY if verify else 0),
           "--jobs", str(min(4, os.cpu_count() or 1))] + (["--full"] if FULL else [])
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, TRITON_INTERPRET="0"), capture_output=True, text=True,
                       timeout=3600)
    seconds = time.perf_counter() - t0
    if not out.exists():
        pytest.fail(f"the cross-compile did not run: {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    by_arch: dict[str, list[dict]] = {}
    for r in json.loads(out.read_text()):
        by_arch.setdefault(r["arch"], []).append(r)
    print(f"\ncross-compile ({'full' if FULL else 'quick'} tier): {p.stdout.strip().splitlines()[-1] if p.stdout else ''}"
          f" [{seconds:.0f} s]")
    return by_arch, p.stdout, seconds


def test_a_run_of_one_test_compiles_for_the_families_it_reads():
    """The mutation checks run one test of this file at a time: its family alone is compiled, and the facts
    file is re-checked only where the test that checks it runs (a run of the whole file: everything)."""
    from types import SimpleNamespace as NS
    this = sys.modules[__name__]

    def item(name, **params):
        return NS(module=this, fixturenames=("compiled",), originalname=name,
                  callspec=NS(params=params) if params else None)
    assert _needed(NS(items=[item("test_every_kernel_fits", arch="sm_80")])) == (["sm_80"], False)
    assert _needed(NS(items=[item("test_h100_runs_its_tables_as_they_are")])) == (["sm_90"], False)
    assert _needed(NS(items=[item("test_facts_file_says_what_the_compiler_says")])) == (list(ARCHS), True)
    assert _needed(NS(items=[item("test_every_kernel_fits", arch=a) for a in ("sm_75", "sm_86")])) == \
        (["sm_86", "sm_75"], False)


def _lines(rs: list[dict]) -> str:
    return "\n".join(f"  {r['stage']} {r['kernel']} {r['label']}: {'; '.join(r['problems'])}" for r in rs)


@pytest.mark.given
@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_kernel_fits(compiled, arch):
    """What runs on ``arch`` compiles there and fits its shared memory per block and registers."""
    by_arch, _, _ = compiled
    rs = by_arch.get(arch, [])
    assert rs, f"nothing was compiled for {arch}"
    bad = [r for r in rs if not r["ok"]]
    assert not bad, (f"{len(bad)} of {len(rs)} kernels do not fit {arch} ({ARCHS[arch].gpus}; "
                     f"{ARCHS[arch].smem_per_block} B of shared memory a block):\n{_lines(bad)}")


@pytest.mark.given
def test_facts_file_says_what_the_compiler_says(compiled):
    _, stdout, _ = compiled
    bad = [ln for ln in stdout.splitlines() if ln.strip().startswith("MISMATCH")]
    assert not bad, ("tests/data/portability_facts.json disagrees with the compiler; refresh it with "
                     "python -m common.course.portability --update (and --full --update):\n" + "\n".join(bad))


@pytest.mark.given
def test_h100_runs_its_tables_as_they_are(compiled, impl):
    """On sm_90 the 16-bit attention tables (measured on the H100) and the matmul's fixed configs run as
    they are: the fallbacks for smaller GPUs never touch them. (fp32 attention at d = 128 never fitted
    an H100: it falls back there, where it used to fail.)"""
    by_arch, _, _ = compiled
    moved = [r for r in by_arch.get("sm_90", []) if "falls back" in r["label"]
             and r["label"].startswith(("bfloat16", "float16"))]
    assert not moved, "on the H100 these configs no longer run as they are:\n" + "\n".join(
        f"  {r['kernel']} {r['label']}" for r in moved)
    mt = impl.load("a06_matmul.matmul_triton")
    h100 = ((9, 0), ARCHS["sm_90"].smem_per_block)
    for name, sizes in (("TINY_CONFIG", (2, 4)), ("SWEEP_CONFIG", (2,))):   # the sweep is bf16
        for size in sizes:
            assert mt.fit_config(getattr(mt, name), size, h100) == getattr(mt, name), (name, size)


@pytest.mark.given
@pytest.mark.parametrize("size", [2, 4])
def test_matmul_config_sets_on_an_h100_are_unchanged(impl, size):
    """The autotuner's candidates on an sm_90 with 227 KB a block are the ones the 220 KB constant this
    replaced kept, for every kind of call (no compile: the pruning rule)."""
    mod = impl.load("a06_matmul.matmul_triton")
    old_limit = 220 * 1024    # the H100 constant matmul_triton used before issue #33
    for m in (1, 16, 64, 65, 4096):
        for k in (64, 768, 2048, 4096, 4095):
            for aligned in (True, False):
                pairs = mod._config_set(m, k, size, aligned)
                old = [(c, p) for c, p in pairs if c[4] * (c[0] + c[1]) * c[2] * size <= old_limit]
                assert mod.configs_for(m, k, size, aligned, ((9, 0), ARCHS["sm_90"].smem_per_block)) == old, \
                    (m, k, size, aligned)


@pytest.mark.given
def test_attention_falls_back_where_a_config_does_not_fit(impl, monkeypatch):
    """flash_triton's launch: a config the GPU's shared memory cannot hold (Triton's OutOfResources at the
    launch) is replaced by the first of smaller_configs that fits, and that one is launched directly
    from then on; a forced config (launch_options) is not replaced."""
    from triton.runtime.errors import OutOfResources
    mod = impl.load("a07_flash_attention.flash_triton")
    cfg = impl.load("a07_flash_attention.flash_configs")     # the launch helpers' module (its fallbacks)
    launched = []

    class Fake:
        __name__ = "fake_kernel"

        def __getitem__(self, grid):
            def launch(*args, **kw):
                launched.append((kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"], kw["num_stages"]))
                if kw["BLOCK_M"] * kw["BLOCK_N"] * kw["num_stages"] > 64 * 64 * 2:   # this "GPU" holds no more
                    raise OutOfResources(1, 0, "shared memory")
            return launch

    fake = Fake()
    monkeypatch.setattr(cfg, "_smaller", {})
    kwargs = dict(HEAD_DIM=128, CAUSAL=True, BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    mod._launch(fake, (1,), (), dict(kwargs), True)
    assert launched == [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 2)], launched
    launched.clear()
    mod._launch(fake, (1,), (), dict(kwargs), True)
    assert launched == [(64, 64, 4, 2)], f"the fallback was not remembered: {launched}"
    with pytest.raises(OutOfResources):
        mod._launch(fake, (1,), (), dict(kwargs, BLOCK_M=256), False)


def test_the_gpu_table_is_the_one_the_readme_shows():
    """README's "Which GPU" table names every family the cross-compile checks, with its shared memory."""
    readme = (REPO / "README.md").read_text()
    for a in ARCHS.values():
        assert a.name in readme, f"README's GPU table lacks {a.name}"
        assert f"{a.smem_per_block // 1024} KB" in readme, f"README's GPU table lacks {a.name}'s {a.smem_per_block // 1024} KB"


@pytest.mark.given
@pytest.mark.parametrize("name, cap, versions", [("Tesla T4", (7, 5), (1, 2, 3, 4)),
                                                  ("NVIDIA A100-SXM4-80GB", (8, 0), (1, 2, 3, 4, 5, 6)),
                                                  ("NVIDIA GeForce RTX 4090", (8, 9), (1, 2, 3, 4, 5, 6)),
                                                  ("NVIDIA H100 80GB HBM3", (9, 0), (1, 2, 3, 4, 5, 6, 7))])
def test_cuda_versions_each_gpu_runs_and_why_not(impl, monkeypatch, name, cap, versions):
    """The CUDA matmul versions a GPU runs (the wrapper's ``unsupported``, the grader's trials), and a
    refusal that names what the version needs and the GPU found (a GPU faked on the CPU)."""
    import torch

    from common.course import stages
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    mod = impl.load("a06_matmul.matmul_cuda")
    assert tuple(v for v in range(1, 8) if not mod.unsupported(v)) == versions
    assert stages._a06_cuda_versions() == versions
    for v in sorted(set(range(1, 8)) - set(versions)):
        why = mod.unsupported(v)
        assert f"sm_{cap[0]}{cap[1]}" in why and name in why and ("sm_90" if v == 7 else "sm_80") in why, why
        assert any(why in note for note in stages._a06_not_here()) or not stages.HAS_CUDA


@pytest.mark.gpu
@pytest.mark.given
def test_attention_on_this_gpu_falls_back_only_where_it_must(impl, monkeypatch):
    """On the GPU at hand: 16-bit attention at d = 64 and 128, forward and backward, takes no fallback where
    this GPU holds the H100's 227 KB a block (the tables run as they are), and fp32 at d = 128, whose table
    tiles fit no GPU, runs its fallback. (On a smaller GPU the 16-bit tables may fall back: that is
    what the fallback is for, and the stage's tests check the results.)"""
    import torch

    from common import gpu
    mod = impl.load("a07_flash_attention.flash_triton")
    cfg = impl.load("a07_flash_attention.flash_configs")     # the launch helpers' module (its fallbacks)
    monkeypatch.setattr(cfg, "_smaller", {})
    for d in (64, 128):
        for dtype in (torch.bfloat16, torch.float16):
            q, k, v = (torch.randn(1, 2, 700, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
            mod.flash_attention(q, k, v, True).sum().backward()
    if gpu.shared_memory_per_block() >= ARCHS["sm_90"].smem_per_block:
        assert not cfg._smaller, f"on {gpu.describe()} the 16-bit tables fell back: {list(cfg._smaller.values())}"
    q, k, v = (torch.randn(1, 2, 300, 128, device="cuda", requires_grad=True) for _ in range(3))
    mod.flash_attention(q, k, v, True).sum().backward()
    torch.cuda.synchronize()
    assert cfg._smaller, "fp32 at d = 128 ran without a fallback: its table config now fits?"


@pytest.mark.nvcc
def test_cuda_sources_compile_for_older_gpus():
    """The CUDA extensions every GPU builds (stage 4's GELU; stage 6's matmul, v7's file without its
    sm_90a code) compile for sm_75, sm_80, sm_86 and sm_89, as torch builds them for such a GPU (the
    stages' own tests check sm_90a). Versions 5-6 use sm_80 instructions: built for sm_75 they trap,
    and the wrapper refuses them there first."""
    from common.cuda_ext import compile_check
    src = REPO / "solutions"
    compile_check([src / "a04_cuda_gelu" / "gelu_kernel.cu", src / "a06_matmul" / "matmul_kernels.cu",
                   src / "a06_matmul" / "matmul_v7_wgmma.cu"], archs=("sm_75", "sm_80", "sm_86", "sm_89"))
