"""`make mutate`: mutmut over service/runtime, service/codecs and service/introspection, bounded in time.

Steps: (1) mutmut generates every mutant of the three packages (into `mutants/`, never touching
the sources); (2) a seeded sample, stratified by file, is drawn from them; (3) `mutmut run` tests
the sample: it first records which tests of the pool (`[tool.mutmut]` in pyproject.toml) call
each function, then runs each mutant against only the tests that cover it, fastest first,
stopping at the first failure; (4) at the time budget the run is interrupted and what finished
counts; (5) `mutation/REPORT.md` lists the survival rate, per file, and every survivor with its
diff and its verdict from `mutation/survivors.toml`.

    python -m mutation.run [--sample 300] [--seed 18] [--minutes 27] [--children 2] [--only GLOB]

Not part of `make test`: it takes most of half an hour on two cores. Needs the `mutate` extra
(mutmut, pinned: this driver uses mutmut 3.8's generation step and its `.meta` files).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VERDICTS = ROOT / "mutation" / "survivors.toml"
REPORT = ROOT / "mutation" / "REPORT.md"
MUTANTS = ROOT / "mutants"
PACKAGES = ("service/runtime", "service/codecs", "service/introspection")

# mutmut 3.8's exit codes (mutmut/stats.py), grouped the way the report counts them.
KILLED = {1: "killed", 3: "killed", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout"}
KILLED |= {37: "caught by type check", -11: "segfault", -9: "segfault"}
SURVIVED = {0: "survived", 5: "no tests", 33: "no tests", 35: "suspicious"}
STATUSES = ("killed", "timeout", "survived", "no tests", "suspicious", "not run", "other")


def status_of(code: int | None) -> str:
    """The report's word for a mutmut exit code; None: the budget ran out first."""
    if code is None:
        return "not run"
    if code in KILLED:
        return "timeout" if KILLED[code] == "timeout" else "killed"
    return SURVIVED.get(code, "other")


def is_survivor(status: str) -> bool:
    return status in ("survived", "no tests", "suspicious")


# ---- names, sampling ----------------------------------------------------------------------------

_NAME = re.compile(r"^(?P<module>.+)\.x(?:ǁ(?P<cls>[^ǁ]+)ǁ|_)(?P<function>.+?)__mutmut_(?P<number>\d+)$")


@dataclass(frozen=True)
class Mutant:
    name: str  # mutmut's: `service.codecs.oip.x_decode_tensor__mutmut_7`

    @property
    def _parts(self) -> re.Match[str]:
        match = _NAME.match(self.name)
        if match is None:
            raise ValueError(f"not a mutmut mutant name: {self.name!r}")
        return match

    @property
    def file(self) -> str:
        return self._parts["module"].replace(".", "/") + ".py"

    @property
    def function(self) -> str:
        """`decode_tensor`, or `Class.method` for a method."""
        parts = self._parts
        return f"{parts['cls']}.{parts['function']}" if parts["cls"] else parts["function"]


def sample(names: Iterable[str], size: int, seed: int) -> list[str]:
    """`size` names drawn without replacement, each file's share proportional to its mutants (at least one)."""
    by_file: dict[str, list[str]] = defaultdict(list)
    for name in sorted(names):
        by_file[Mutant(name).file].append(name)
    total = sum(len(v) for v in by_file.values())
    if size >= total:
        return sorted(n for v in by_file.values() for n in v)
    rng = random.Random(seed)
    picked: list[str] = []
    for file in sorted(by_file):
        group = by_file[file]
        share = max(1, round(size * len(group) / total))
        picked += rng.sample(group, min(share, len(group)))
    rng.shuffle(picked)
    return sorted(picked[:size])


# ---- verdicts on survivors ----------------------------------------------------------------------


@dataclass(frozen=True)
class Diff:
    removed: tuple[str, ...]
    added: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Diff:
        """The changed lines of a unified diff (as `mutmut show` prints it), whitespace-normalized."""
        removed, added = [], []
        for line in text.splitlines():
            if line.startswith(("---", "+++")):
                continue
            if line.startswith("-"):
                removed.append(" ".join(line[1:].split()))
            elif line.startswith("+"):
                added.append(" ".join(line[1:].split()))
        return cls(tuple(removed), tuple(added))


@dataclass(frozen=True)
class Verdict:
    """One `[[survivor]]` of survivors.toml: which mutants it covers, and what a person said about them."""

    status: str  # "equivalent" (no behaviour a user could see changes) or "gap" (a test is missing)
    reason: str
    file: str = "*"
    function: str = "*"
    before: str = ""  # a substring of the removed line(s)
    after: str = ""  # a substring of the added line(s)

    def matches(self, mutant: Mutant, diff: Diff) -> bool:
        return (
            fnmatch.fnmatch(mutant.file, self.file)
            and fnmatch.fnmatch(mutant.function, self.function)
            and (not self.before or any(self.before in line for line in diff.removed))
            and (not self.after or any(self.after in line for line in diff.added))
        )


def load_verdicts(path: Path = VERDICTS) -> list[Verdict]:
    data = tomllib.loads(path.read_text()) if path.exists() else {}
    verdicts = [Verdict(**entry) for entry in data.get("survivor", [])]
    for v in verdicts:
        if v.status not in ("equivalent", "gap"):
            raise ValueError(f"{path}: status must be 'equivalent' or 'gap', not {v.status!r} ({v.reason})")
    return verdicts


def verdict_for(mutant: Mutant, diff: Diff, verdicts: Sequence[Verdict]) -> Verdict | None:
    """The first verdict that matches, or None: a survivor nobody has judged yet."""
    return next((v for v in verdicts if v.matches(mutant, diff)), None)


# ---- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    status: str
    seconds: float | None  # mutmut's record of the mutant's test time (0 under its fork server)
    diff: str  # only kept for survivors


def survival_rate(outcomes: Sequence[Outcome]) -> float:
    """Survivors over the mutants that were checked (killed, timed out or survived)."""
    checked = [o for o in outcomes if o.status not in ("not run", "other")]
    return sum(is_survivor(o.status) for o in checked) / len(checked) if checked else 0.0


def render(outcomes: Sequence[Outcome], verdicts: Sequence[Verdict], meta: Mapping[str, Any]) -> str:
    counts = Counter(o.status for o in outcomes)
    checked = sum(counts[s] for s in STATUSES if s not in ("not run", "other"))
    survivors = [o for o in outcomes if is_survivor(o.status)]
    judged = [(o, verdict_for(o.mutant, Diff.parse(o.diff), verdicts)) for o in survivors]
    lines = [
        "# Mutation testing report",
        "",
        f"Written by `make mutate` (`python -m mutation.run`) on {meta['date']}: mutmut {meta['mutmut']}, "
        f"{meta['children']} worker(s), over {', '.join(f'`{p}`' for p in PACKAGES)}"
        + (f", files matching `{meta['only']}`." if meta.get("only", "*") != "*" else "."),
        "",
        f"- mutants generated: {meta['generated']}; sampled: {len(outcomes)} (seed {meta['seed']}, "
        "stratified by file); checked: " + str(checked),
        f"- **survival rate: {100 * survival_rate(outcomes):.1f} %** "
        f"({len(survivors)} of {checked}; survived, no covering test, or suspicious)",
        f"- survivors judged: {sum(v is not None for _, v in judged)} "
        f"(equivalent {sum(v is not None and v.status == 'equivalent' for _, v in judged)}, "
        f"known gap {sum(v is not None and v.status == 'gap' for _, v in judged)}); "
        f"**not yet judged: {sum(v is None for _, v in judged)}**",
        f"- wall time {meta['wall_s'] / 60:.1f} min (budget {meta['minutes']} min), of which testing mutants "
        + (
            f"{checked / meta['rate'] / 60:.1f} min: {meta['rate']:.2f} mutants/s, "
            f"{meta['children'] / meta['rate']:.1f} s per mutant in one worker"
            if meta.get("rate")
            else "(no rate in mutants/run.log)"
        )
        + (f"; not run (budget): {counts['not run']}" if counts["not run"] else ""),
        "",
        "| status | mutants |",
        "|---|---:|",
        *(f"| {s} | {counts[s]} |" for s in STATUSES if counts[s]),
        "",
        "## Per file",
        "",
        "| file | sampled | killed | survived |",
        "|---|---:|---:|---:|",
    ]
    by_file: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_file[o.mutant.file].append(o)
    for file, group in sorted(by_file.items()):
        killed = sum(o.status in ("killed", "timeout") for o in group)
        lines.append(f"| `{file}` | {len(group)} | {killed} | {sum(is_survivor(o.status) for o in group)} |")
    lines += ["", "## Survivors", ""]
    if not survivors:
        lines.append("None.")
    order = {"gap": 1, "equivalent": 2}
    for outcome, verdict in sorted(judged, key=lambda p: (order.get(p[1].status if p[1] else "", 0), p[0].mutant.name)):
        word = "NOT YET JUDGED" if verdict is None else ("known gap" if verdict.status == "gap" else "equivalent")
        reason = "" if verdict is None else f": {verdict.reason}"
        lines += [
            f"### `{outcome.mutant.name}` ({outcome.status})",
            "",
            f"`{outcome.mutant.file}`, `{outcome.mutant.function}`. **{word}**{reason}",
            "",
            "```diff",
            outcome.diff.strip(),
            "```",
            "",
        ]
    lines += [
        "A survivor is judged in `mutation/survivors.toml`: equivalent (with the reason no user could tell), or a",
        "known gap (a test to write). Matching is by file, function and the changed line, not by mutmut's number.",
        "",
    ]
    return "\n".join(lines)


def mutation_rate(log: str) -> float | None:
    """mutmut's closing "N mutations/second" (of its mutant-testing phase), if it printed one."""
    rates = re.findall(r"([\d.]+) mutations/second", log)
    return float(rates[-1]) if rates and float(rates[-1]) > 0 else None


# ---- driving mutmut -----------------------------------------------------------------------------


def mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def generate(children: int) -> list[str]:
    """Every mutant name of the configured files: mutmut 3.8's generation step, as `mutmut run` begins it."""
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "from pathlib import Path\n"
        "import mutmut.__main__ as m\n"
        "m.set_mutant_under_test('mutant_generation')\n"
        "Path('mutants').mkdir(exist_ok=True)\n"
        "m.copy_src_dir(); m.copy_also_copy_files(); m.setup_source_paths()\n"
        f"m.create_mutants({children})\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    names: list[str] = []
    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        names += json.loads(meta.read_text())["exit_code_by_key"]
    return names


def exit_codes() -> dict[str, tuple[int | None, float | None]]:
    """Every mutant's exit code and test seconds from mutmut's `.meta` files."""
    found: dict[str, tuple[int | None, float | None]] = {}
    for meta in MUTANTS.rglob("*.py.meta"):
        data = json.loads(meta.read_text())
        durations = data.get("durations_by_key", {})
        for name, code in data["exit_code_by_key"].items():
            found[name] = (code, durations.get(name))
    return found


def run_mutmut(names: Sequence[str], children: int, deadline: float) -> None:
    """`mutmut run NAMES`, interrupted (SIGINT: mutmut keeps what finished) at the deadline."""
    log = (MUTANTS / "run.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *names],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        process.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        print("time budget reached: stopping mutmut (finished mutants count)", flush=True)
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    finally:
        log.close()


def show(name: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "mutmut", "show", name], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return "\n".join(line for line in done.stdout.splitlines() if not line.startswith("# "))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=int, default=300, help="mutants to test (default 300)")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--minutes", type=float, default=27.0, help="stop and report after this long (default 27)")
    parser.add_argument("--children", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--only", default="*", help="glob over files, e.g. 'service/codecs/oip.py'")
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the report of the last run (after judging survivors)"
    )
    args = parser.parse_args(argv)
    if args.report_only:
        last = json.loads((MUTANTS / "sample.json").read_text())
        return write_report(last["names"], last["meta"], args.report)
    started = time.monotonic()
    deadline = started + 60 * args.minutes
    shutil.rmtree(MUTANTS, ignore_errors=True)  # fresh: no verdict of an older run is read as this one's
    names = generate(args.children)
    generated = len(names)
    names = [n for n in names if fnmatch.fnmatch(Mutant(n).file, args.only)]
    if not names:
        print(f"no mutants in files matching {args.only!r}", file=sys.stderr)
        return 2
    picked = sample(names, args.sample, args.seed)
    print(f"{generated} mutants generated; testing {len(picked)} (log: mutants/run.log)", flush=True)
    run_mutmut(picked, args.children, deadline)
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mutmut": mutmut_version(),
        "children": args.children,
        "generated": generated,
        "seed": args.seed,
        "only": args.only,
        "minutes": args.minutes,
        "wall_s": time.monotonic() - started,
        "rate": mutation_rate((MUTANTS / "run.log").read_text(errors="replace")),
    }
    (MUTANTS / "sample.json").write_text(json.dumps({"names": picked, "meta": meta}))
    return write_report(picked, meta, args.report)


def write_report(names: Sequence[str], meta: Mapping[str, Any], path: Path) -> int:
    codes = exit_codes()
    outcomes = []
    for name in names:
        code, seconds = codes.get(name, (None, None))
        status = status_of(code)
        outcomes.append(Outcome(Mutant(name), status, seconds, show(name) if is_survivor(status) else ""))
    path.write_text(render(outcomes, load_verdicts(), meta))
    checked = sum(o.status not in ("not run", "other") for o in outcomes)
    if names and not checked:  # mutmut's own test run failed (see mutants/run.log): a 0 % rate would be a lie
        print(f"no mutant was checked of {len(names)} sampled; see {MUTANTS / 'run.log'}", file=sys.stderr)
        return 1
    print(f"survival rate {100 * survival_rate(outcomes):.1f} % over {checked} checked mutants; report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
