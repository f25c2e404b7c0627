"""The command line: ``python -m common.course.grade --help`` (``make grade``)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.course import grade as _package

from .batch import grade_many
from .report import gradescope, plots, report_json, table
from .run import grade
from .score import SCORING


def main(argv: list[str] | None = None) -> int:
    from common.impl import add_impl_argument
    ap = argparse.ArgumentParser(prog="python -m common.course.grade", description=_package.__doc__.split("\n\n")[0],
                                 epilog=SCORING, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_impl_argument(ap)
    ap.add_argument("--stages", help="comma-separated stages, e.g. a01,a05 or 1,5 (default: all)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per stage (tests, then trials+timing)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    ap.add_argument("--json-out", type=Path, help="also write the JSON report here")
    ap.add_argument("--results-json", type=Path, help="write a Gradescope results.json here")
    ap.add_argument("--plots", type=Path, help="write speedup.png and roofline.png here (GPU runs)")
    ap.add_argument("--no-tests", action="store_true", help="skip the pytest part (trials and timing only)")
    ap.add_argument("--borrow", help="stages to take from solutions/ where another stage imports them, e.g. a06,a07 "
                                     "(stage 8 runs on a06 and a07); the borrowed stages are graded on your own code")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--submissions", type=Path, help="grade every sub-folder of this folder")
    ap.add_argument("--out", type=Path, default=Path("grade-results"), help="with --submissions: output folder")
    ap.add_argument("--jobs", type=int, default=1, help="with --submissions on CPU: processes at once")
    ap.add_argument("--memory-gb", type=float, default=32.0,
                    help="with --submissions: the most resident memory one submission's processes may hold")
    ap.add_argument("--no-sandbox", action="store_true",
                    help="with --submissions: grade without the sandbox (trusted code only; see INSTRUCTORS.md)")
    args = ap.parse_args(argv)
    stages = None
    if args.stages:
        from common.impl import StageError, stage_list
        from common.course.stages import STAGES
        try:
            stages = stage_list(args.stages, [s.key for s in STAGES])
        except StageError as e:            # the message alone: it lists the stages
            print(f"{ap.prog}: --stages {e}", file=sys.stderr)
            return 2
    if args.submissions:
        return grade_many(args.submissions, args.out, args.jobs, args.timeout, stages, not args.no_tests,
                          sandbox=not args.no_sandbox, memory_gb=args.memory_gb)
    import torch
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    results, secs = grade(args.impl, stages, args.timeout, not args.no_tests, args.quiet or args.json, args.borrow)
    report = report_json(results, str(args.impl), gpu, secs)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(table(results, str(args.impl), gpu))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=1))
    if args.results_json:
        args.results_json.parent.mkdir(parents=True, exist_ok=True)
        args.results_json.write_text(json.dumps(gradescope(results, secs), indent=1))
    if args.plots:
        for p in plots(results, args.plots):
            print(f"wrote {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
