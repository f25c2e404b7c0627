"""The course's own tooling, apart so a student never opens it: grader, stage registry, guard, benches, self-checks.

A student works with ``common`` (checks, timing, profiling, roofline, launch helpers, impl, testing,
references); what grades, benches, profiles (ncu), cross-compiles, times the host cost of and
generates the course lives here.
"""
