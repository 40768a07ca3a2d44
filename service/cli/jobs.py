"""`hookserve jobs`: the server's data-set jobs (admin token, from $HOOKSERVE_ADMIN_TOKEN): start one, list them,
show one, follow one to its end with a progress bar, read or download its result, cancel or delete it.

    hookserve jobs start unit_stats lenet digits -l conv1 -l fc1 -p bins=32 --wait
    hookserve jobs result JOB_ID -o stats/
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tqdm import tqdm

from service.cli.errors import EXIT_INTERRUPTED, EXIT_REFUSED, EXIT_USAGE, CliError
from service.cli.output import print_json, print_table
from service.cli.remote import Handler, client_options, layer_list, make_client, param_item
from service.client import Client, calls
from service.client.errors import HookserveError, NotFound
from service.client.features.store import write_atomic

# The server's job vocabulary (service.specs.vocab's JobState and JobKindName), spelled here so that the command
# imports nothing of the server; tests/cli/test_jobs_cli.py checks they stay equal.
ACTIVE = ("queued", "running")
FAILED, CANCELLED = "failed", "cancelled"
RESULT_FILE = "result.json"  # every succeeded job's result, as the server keeps it
TEXT_PARAMETERS = ("positive", "negative", "name")  # class names and a vector's name: `positive=3` is the text "3"
SHOWN_ERRORS = 20
KIND_PARAMETERS = {  # the parameters each kind reads; GET /jobs/{id} lists every one, the others at their defaults
    "unit_stats": ("bins", "range"),
    "exemplars": ("k", "score"),
    "similarity": ("reduce",),
    "steering_vector": ("positive", "negative", "name"),
    "features": ("reduce", "shard_size"),
}


def job_param(item: str) -> tuple[str, Any]:
    """`bins=32` -> ("bins", 32), `range=[0,4]` -> ("range", [0, 4]); `positive=3` stays the text "3"."""
    key, value = param_item(item)
    return (key, item.partition("=")[2]) if key in TEXT_PARAMETERS else (key, value)


@contextmanager
def server_words() -> Iterator[None]:
    """The server's 404 names `GET /jobs` as the list of jobs; at a shell that list is `hookserve jobs list`."""
    try:
        yield
    except HookserveError as exc:
        exc.detail = exc.detail.replace("GET /jobs lists them", "`hookserve jobs list` lists them")
        raise


def parameter_text(job: dict[str, Any]) -> str:
    """The parameters the job's kind reads, as `-p` takes them: `bins=32 range=null`."""
    given = job.get("parameters") or {}
    keys = KIND_PARAMETERS.get(job["kind"], tuple(given))
    return " ".join(f"{key}={json.dumps(given[key])}" for key in keys if key in given)


def done_text(job: dict[str, Any]) -> str:
    return f"{job['done']}/{job['total']}"


def seconds(job: dict[str, Any]) -> float | None:
    started, finished = job.get("started"), job.get("finished")
    return finished - started if started is not None and finished is not None else None


def when(stamp: float | None) -> str | None:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if stamp is not None else None


class Bar:
    """A tqdm bar on stderr over a job's samples (samples/s and ETA), fed by polling GET /jobs/{id}."""

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = enabled  # None: only when stderr is a terminal
        self.bar: Any = None  # a tqdm bar once the first state is shown
        self.done = 0

    def show(self, job: dict[str, Any]) -> None:
        if self.bar is None:
            disable = None if self.enabled is None else not self.enabled  # tqdm's None: off when not a terminal
            self.bar = tqdm(
                total=job["total"],
                initial=job["done"],
                unit="sample",
                desc=f"job {job['id']}",
                disable=disable,
                dynamic_ncols=True,
                smoothing=0,
            )
            self.done = job["done"]
        if self.bar.total != job["total"]:
            self.bar.total = job["total"]
        skipped = f", {job['error_count']} skipped" if job.get("error_count") else ""
        self.bar.set_postfix_str(f"{job['state']}{skipped}")  # shown even when no sample was done since
        self.bar.update(job["done"] - self.done)
        self.done = job["done"]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def follow(client: Client, job: dict[str, Any], args: argparse.Namespace) -> int:
    """Poll the job until it ends, with a bar on stderr; the exit status by its final state."""
    bar = Bar(False if args.no_progress or args.json else None)
    try:
        while job["state"] in ACTIVE:
            bar.show(job)
            time.sleep(args.poll)
            job = client.job(job["id"])
        bar.show(job)
    except KeyboardInterrupt:
        bar.close()
        print(
            f"stopped watching; job {job['id']} goes on on the server (`hookserve jobs wait {job['id']}` follows "
            f"it again, `hookserve jobs cancel {job['id']}` stops it)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    finally:
        bar.close()
    return ended(job, args)


def ended(job: dict[str, Any], args: argparse.Namespace) -> int:
    """0 for a succeeded job (its summary, or its state under --json); a failed or cancelled one is an error."""
    if job["state"] == FAILED:
        raise CliError(f"job {job['id']} failed: {job.get('error') or 'the server gave no reason'}", EXIT_REFUSED)
    if job["state"] == CANCELLED:
        raise CliError(f"job {job['id']} was cancelled after {job['done']} of {job['total']} samples", EXIT_REFUSED)
    if args.json:
        print_json(job)
        return 0
    took = seconds(job)
    line = f"job {job['id']} {job['state']}: {job['done']} of {job['total']} samples"
    line += f" in {took:.1f} s" if took is not None else ""
    if job.get("error_count"):
        line += f", {job['error_count']} skipped (`hookserve jobs show {job['id']}` lists them)"
    print(line)
    return 0


# ---- commands ---------------------------------------------------------------------------------


def cmd_start(args: argparse.Namespace) -> int:
    parameters = dict(args.param) or None
    with make_client(args) as client, server_words():
        job = client.start_job(
            args.kind, args.model, args.dataset, layer_list(args.layers), limit=args.limit, parameters=parameters
        )
        if not args.wait:
            if args.json:
                print_json(job)
            else:
                print(job["id"])
            return 0
        if not args.json:
            print(job["id"], flush=True)
        return follow(client, job, args)


def cmd_list(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        found = client.jobs()
    if args.json:
        print_json(found)
        return 0
    rows = [[j["id"], j["kind"], j["model"], j["dataset"], j["state"], done_text(j)] for j in found]
    print_table(["id", "kind", "model", "dataset", "state", "done/total"], rows)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with make_client(args) as client, server_words():
        job = client.job(args.id)
    if args.json:
        print_json(job)
        return 0
    rate = job.get("rate")
    eta = job.get("eta_s")
    fields: list[list[Any]] = [
        ["id", job["id"]],
        ["kind", job["kind"]],
        ["model", job["model"]],
        ["dataset", job["dataset"]],
        ["layers", job["layers"]],
        ["parameters", parameter_text(job)],
        ["state", job["state"]],
        ["progress", f"{job['done']} of {job['total']} samples ({100 * job['progress']:.0f}%)"],
        ["rate", f"{rate:.1f} samples/s" if rate is not None else None],
        ["eta", f"{eta:.0f} s" if eta is not None else None],
        ["skipped", job.get("error_count", 0)],
        ["error", job.get("error")],
        ["resumed from", job.get("resumed_from")],
        ["created", when(job.get("created"))],
        ["started", when(job.get("started"))],
        ["finished", when(job.get("finished"))],
    ]
    print_table(["field", "value"], fields)
    errors = job.get("errors") or []
    if errors:
        print()
        shown = errors[:SHOWN_ERRORS]
        print_table(["sample", "file", "why skipped"], [[e["index"], e.get("file"), e["detail"]] for e in shown])
        if job.get("error_count", 0) > len(shown):
            print(f"... and {job['error_count'] - len(shown)} more (`hookserve jobs show {job['id']} --json`)")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with make_client(args) as client, server_words():
        before = client.job(args.id)
        active = before["state"] in ACTIVE
        if not active and not args.delete:
            raise CliError(
                f"job {args.id} already {before['state']}; `hookserve jobs cancel {args.id} --delete` deletes it "
                "and its files",
                EXIT_USAGE,
            )
        job = client.cancel_job(args.id)  # a queued or running job is cancelled, a finished one deleted
        deleted = not active
        if active and args.delete:
            with suppress(NotFound):  # NotFound: it ended between the two calls, and the first one deleted it
                job = client.cancel_job(args.id)  # now finished: deleted
            deleted = True
    if args.json:
        print_json({**job, "deleted": deleted})
    elif deleted:
        print(f"deleted job {args.id} ({job['state']}) and its files")
    else:
        print(f"cancelled job {args.id} after {job['done']} of {job['total']} samples")
    return 0


def cmd_result(args: argparse.Namespace) -> int:
    out: Path | None = args.output
    with make_client(args) as client, server_words():
        if out is None:
            print_json(client.job_result(args.id))
            return 0
        folder = client.download_job(args.id, out)  # the files the result lists, each checked against its record
        data = client.send(calls.job_file(args.id, RESULT_FILE))
    write_atomic(folder / RESULT_FILE, data)
    names = [*json.loads(data).get("files", []), RESULT_FILE]
    files = [{"file": str(folder / name), "bytes": (folder / name).stat().st_size} for name in names]
    if args.json:
        print_json({"dir": str(folder), "files": files})
        return 0
    print_table(["file", "bytes"], [[f["file"], f["bytes"]] for f in files])
    print(f"wrote {len(files)} file{'' if len(files) == 1 else 's'} into {folder}")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    with make_client(args) as client, server_words():
        return follow(client, client.job(args.id), args)


# ---- parsers ----------------------------------------------------------------------------------


def following(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--poll", type=float, default=0.5, metavar="SECONDS", help="how often to ask for the state")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (it is off anyway when stderr is no terminal)"
    )


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = "the server's data-set jobs (admin token): start, list, show, wait, result, cancel"
    group = commands.add_parser("jobs", help=text, description=text)
    verbs = group.add_subparsers(dest="verb", metavar="VERB", required=True, help="what to do with jobs")
    parent = client_options()

    def verb(name: str, handler: Handler, text: str) -> argparse.ArgumentParser:
        parser = verbs.add_parser(name, parents=[parent], help=text, description=text)
        parser.set_defaults(handler=handler)
        return parser

    def job_id(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("id", metavar="ID", help="a job's id (`hookserve jobs list` lists them)")

    kinds = list(KIND_PARAMETERS)
    p = verb("start", cmd_start, "start a job over a data set; prints its id (--wait: follows it to its end)")
    p.add_argument("kind", metavar="KIND", choices=kinds, help="what the job computes: " + ", ".join(kinds))
    p.add_argument("model", help="a model name (`hookserve models` lists them)")
    p.add_argument("dataset", help="digits (built in), or a folder of class subfolders under the server's data dir")
    p.add_argument(
        "-l",
        "--layers",
        action="append",
        required=True,
        metavar="LAYER",
        help="module paths or patterns (comma-separated; repeat -l for more)",
    )
    p.add_argument("--limit", type=int, metavar="N", help="only the data set's first N samples")
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        type=job_param,
        metavar="KEY=VALUE",
        help="a parameter of the kind, VALUE as JSON: bins=32 range=[0,4] (unit_stats), k=9 score=mean (exemplars), "
        "reduce=flatten (similarity, features), shard_size=256 (features), positive=3 negative=7 name=NAME "
        "(steering_vector)",
    )
    p.add_argument(
        "--wait", action="store_true", help="follow the job until it ends; exit 3 if it fails or is cancelled"
    )
    following(p)

    verb("list", cmd_list, "every job on the server, oldest first")

    p = verb("show", cmd_show, "one job's state, progress, rate, ETA and skipped samples")
    job_id(p)

    p = verb("wait", cmd_wait, "follow a job until it ends (progress on stderr); exit 3 if it fails or is cancelled")
    job_id(p)
    following(p)

    p = verb("result", cmd_result, "a succeeded job's result as JSON, or -o: its files into a folder")
    job_id(p)
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="DIR",
        help="write result.json and every file the result lists (a features job's index.json and shards, "
        "each checked against its size and SHA-256) into DIR",
    )

    p = verb("cancel", cmd_cancel, "cancel a queued or running job (it stays listed, cancelled)")
    job_id(p)
    p.add_argument("--delete", action="store_true", help="delete the job and its files, finished or not")
