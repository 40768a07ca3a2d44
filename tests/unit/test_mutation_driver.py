"""`make mutate`'s driver (mutation/run.py): names, sampling, verdicts and the report, without running mutmut."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mutation.run import (
    Diff,
    Mutant,
    Outcome,
    Verdict,
    load_verdicts,
    mutation_rate,
    render,
    sample,
    status_of,
    survival_rate,
    verdict_for,
)

DIFF = """--- service/runtime/batching.py
+++ service/runtime/batching.py
@@ -2,7 +2,7 @@
     sizes = [int(x.shape[0]) for x in inputs]
-        return list(torch.split(output, sizes))
+        return list(torch.split(output, sorted(sizes)))
"""


@pytest.mark.parametrize(
    ("name", "file", "function"),
    [
        ("service.runtime.batching.x_split_output__mutmut_3", "service/runtime/batching.py", "split_output"),
        ("service.introspection.targets.x__resolve_one__mutmut_24", "service/introspection/targets.py", "_resolve_one"),
        (
            "service.runtime.executor.xǁModelExecutorǁ_work__mutmut_2",
            "service/runtime/executor.py",
            "ModelExecutor._work",
        ),
    ],
)
def test_mutant_names_give_file_and_function(name: str, file: str, function: str) -> None:
    assert (Mutant(name).file, Mutant(name).function) == (file, function)


def test_a_name_that_is_not_mutmuts_is_refused() -> None:
    with pytest.raises(ValueError, match="not a mutmut mutant name"):
        _ = Mutant("service.runtime.batching.split_output").file


def names(file: str, count: int) -> list[str]:
    module = file.removesuffix(".py").replace("/", ".")
    return [f"{module}.x_f__mutmut_{i}" for i in range(1, count + 1)]


def test_the_sample_is_seeded_and_stratified_by_file() -> None:
    everything = names("service/a.py", 90) + names("service/b.py", 10) + names("service/c.py", 1)
    picked = sample(everything, 20, seed=1)
    assert picked == sample(list(reversed(everything)), 20, seed=1)  # order of discovery does not matter
    assert picked != sample(everything, 20, seed=2)
    assert len(picked) == len(set(picked)) == 20
    per_file = {f: sum(Mutant(n).file == f for n in picked) for f in ("service/a.py", "service/b.py", "service/c.py")}
    assert per_file["service/c.py"] == 1  # every file gets at least one
    assert per_file["service/a.py"] > 5 * per_file["service/b.py"] / 2
    assert sample(everything, 500, seed=1) == sorted(everything)


def test_diff_lines_are_read_without_the_headers() -> None:
    diff = Diff.parse(DIFF)
    assert diff.removed == ("return list(torch.split(output, sizes))",)
    assert diff.added == ("return list(torch.split(output, sorted(sizes)))",)


def test_verdicts_match_by_file_function_and_changed_line() -> None:
    mutant = Mutant("service.runtime.batching.x_split_output__mutmut_3")
    diff = Diff.parse(DIFF)
    wrong_line = Verdict("equivalent", "no", file="service/runtime/batching.py", before="torch.cat")
    wrong_function = Verdict("equivalent", "no", function="run_batch")
    right = Verdict("gap", "yes", file="service/runtime/*.py", function="split_*", after="sorted(")
    assert verdict_for(mutant, diff, [wrong_line, wrong_function]) is None
    assert verdict_for(mutant, diff, [wrong_line, right, Verdict("equivalent", "later")]) is right


def test_the_checked_in_verdicts_load() -> None:
    verdicts = load_verdicts()
    assert verdicts
    assert all(v.status in ("equivalent", "gap") and v.reason for v in verdicts)


def test_the_rate_is_mutmuts_last_one() -> None:
    assert mutation_rate("0.57 mutations/second\r...\r0.32 mutations/second\n") == 0.32
    assert mutation_rate("Failed to run clean test") is None


def test_statuses_and_survival_rate() -> None:
    assert [status_of(c) for c in (1, 3, 36, 0, 33, None)] == [
        "killed",
        "killed",
        "timeout",
        "survived",
        "no tests",
        "not run",
    ]
    outcomes = [
        Outcome(Mutant(n), s, 1.0, DIFF if s == "survived" else "")
        for n, s in zip(names("service/a.py", 5), ["killed", "killed", "timeout", "survived", "not run"], strict=True)
    ]
    assert survival_rate(outcomes) == 0.25  # one of the four checked; the one not run does not count


def test_the_report_lists_every_survivor_and_says_which_are_unjudged() -> None:
    killed = Outcome(Mutant("service.runtime.batching.x_run_batch__mutmut_1"), "killed", 2.0, "")
    survivor = Outcome(Mutant("service.runtime.batching.x_split_output__mutmut_3"), "survived", 3.0, DIFF)
    meta = {
        "date": "today",
        "mutmut": "3.8.1",
        "children": 2,
        "generated": 5001,
        "seed": 18,
        "minutes": 27,
        "rate": 0.5,
    }
    text = render([killed, survivor], [], meta | {"wall_s": 60.0})
    assert "**survival rate: 50.0 %**" in text
    assert "0.50 mutants/s, 4.0 s per mutant in one worker" in text
    assert "**not yet judged: 1**" in text
    assert "x_split_output__mutmut_3" in text
    assert "+        return list(torch.split(output, sorted(sizes)))" in text
    judged = render([killed, survivor], [Verdict("gap", "a test to write", after="sorted(")], meta | {"wall_s": 1.0})
    assert "**not yet judged: 0**" in judged
    assert "**known gap**: a test to write" in judged


def test_every_test_path_mutmut_runs_exists() -> None:
    """A path missing from the selection makes mutmut's first test run fail, and then no mutant is checked
    (tests/unit/runtime had moved: `make mutate` checked nothing)."""
    root = Path(__file__).resolve().parents[2]
    selection = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"][
        "pytest_add_cli_args_test_selection"
    ]
    assert selection
    values = {i + 1 for i, arg in enumerate(selection) if arg in ("-k", "-m")}  # an option's argument is no path
    paths = [arg for i, arg in enumerate(selection) if not arg.startswith("-") and i not in values]
    assert paths
    assert [path for path in paths if not (root / path).exists()] == []
