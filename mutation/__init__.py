"""Mutation testing as a habit (issue 18): `make mutate` runs mutmut over the packages where a silent bug
hurts most and writes `mutation/REPORT.md`. `mutation/run.py` says how; `mutation/survivors.toml` holds
the verdicts a person gave on surviving mutants (equivalent, or a known gap), which the report reads."""
