"""The Judge: audits every claim of the FKC contracts by measurement, and calibrates the cost model.

`python -m fuel_torch judge --help` (or `fuel-judge`). For each registrable contract it probes
conformance (every accept clause both ways, the return clause, on the eager op, the Python API and
the fake kernel), precision (max error against a correctly rounded or exact reference, next to the
declared bound and torch's own error), determinism (16 repeats and every thread count) and cost
(timed fits of launch overhead + achieved rate, next to torch's). Modules:

- cli: the command line.            audit: runs the checks over a contract set.
- expr: the safe formula evaluator.  probes, family_*: calls, paths and per-family inputs.
- conformance, precision, determinism, timing: the four checks.   report: table, JSON, roofline.
"""
