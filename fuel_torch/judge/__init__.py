"""The Judge: audits every claim of the FKC contracts by measurement, and calibrates the cost model.

`python -m fuel_torch judge --help` (or `fuel-judge`). For each registrable contract it probes
conformance (every accept clause both ways, the return clause, on the eager op, the Python API and
the fake kernel), precision (max error against a correctly rounded or exact reference, next to the
declared bound and torch's own error), determinism (16 repeats and every thread count) and cost
(timed fits of launch overhead + achieved rate, next to torch's, every figure checked against a
roof measured at its own working set). Modules:

- cli: the command line.             audit: runs the checks over a contract set.
- probes, family_*: calls, paths and per-family inputs (fuel_torch.families names each family's).
- conformance, precision, determinism, timing: the four checks.   report: table, JSON, roofline.

The formula evaluator (fuel_torch.expr), the cost model it calibrates (fuel_torch.costmodel) and
the timing helper (fuel_torch.timing) live in the core package: the runtime uses them too.
"""
