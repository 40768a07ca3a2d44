"""`hookserve features`: a data set's layer features into sharded safetensors, with a progress bar; resumable."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from tqdm import tqdm

from service.cli.errors import EXIT_INTERRUPTED
from service.cli.output import print_json
from service.cli.remote import client_options, layer_list
from service.client import AsyncClient, Retry
from service.client.features import ExtractionReport, FeatureRequest, Progress, Shard, extract_features_async

SHOWN_FAILURES = 20


class Bar(Progress):
    """A tqdm bar: images/s and ETA; files done by earlier runs count from the start."""

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = enabled  # None: only when stderr is a terminal
        self.bar: Any = None  # a tqdm bar once started
        self.shards = 0  # shards written by this run
        self.files = 0  # the files of those shards

    def start(self, total: int, done: int) -> None:
        disable = None if self.enabled is None else not self.enabled  # tqdm's None: off when not a terminal
        # smoothing 0: the average since the start, the rate the summary prints (tqdm's default, a moving average
        # of the last updates, showed 112 images/s at the end of a run whose summary said 24.1)
        self.bar = tqdm(total=total, initial=done, unit="img", disable=disable, dynamic_ncols=True, smoothing=0)
        if done:
            self.bar.set_postfix_str(f"resumed after {done}")

    def advance(self, images: int) -> None:
        if self.bar is not None:
            self.bar.update(images)

    def shard_written(self, shard: Shard) -> None:
        self.shards += 1
        self.files += shard.rows + len(shard.failed)
        if self.bar is not None and shard.file is not None:
            self.bar.set_postfix_str(f"wrote {shard.file}", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def summary_lines(report: ExtractionReport) -> list[str]:
    """What a person reads at the end: counts, speed, and every failed file (the first 20, then the report)."""
    lines = [
        f"{report.extracted} of {report.files} files have features in {report.out_dir} "
        f"({report.shards_written} shards written now, {report.resumed} files from earlier runs; "
        f"{report.images} files in {report.seconds:.1f} s, {report.images_per_s:.1f} images/s)"
    ]
    if report.failed:
        lines.append(f"{len(report.failed)} files could not be used (listed in {report.out_dir / 'report.json'}):")
        for name, why in list(report.failed.items())[:SHOWN_FAILURES]:
            lines.append(f"  {name}: {why}")
        if len(report.failed) > SHOWN_FAILURES:
            lines.append(f"  ... and {len(report.failed) - SHOWN_FAILURES} more")
    return lines


def interrupted_text(bar: Bar, shard_size: int) -> str:
    """What an interrupted run kept: a shard is written once all its files are done."""
    if bar.shards:
        return (
            f"interrupted; the {bar.shards} shard(s) written by this run ({bar.files} files) are kept: "
            "run the same command to resume"
        )
    return (
        f"interrupted before a shard was complete: nothing of this run was kept (a shard is written once its "
        f"{shard_size} files are done; a smaller --shard-size keeps more of an interrupted run)"
    )


def cmd_features(args: argparse.Namespace) -> int:
    request = FeatureRequest(args.model, tuple(layer_list(args.layers)), args.capture, args.reduce)
    bar = Bar(False if args.no_progress or args.json else None)

    async def run() -> ExtractionReport:
        async with AsyncClient(args.url, timeout=args.timeout, retry=Retry(max_retries=args.retries)) as client:
            return await extract_features_async(
                client,
                args.sources,
                args.out,
                request,
                concurrency=args.concurrency,
                batch_size=args.batch_size,
                shard_size=args.shard_size,
                progress=bar,
            )

    try:
        report = asyncio.run(run())
    except KeyboardInterrupt:
        bar.close()
        print(interrupted_text(bar, args.shard_size), file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        bar.close()
    if args.json:
        print_json(report.to_json())
    else:
        print("\n".join(summary_lines(report)))
    return 0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = (
        "features of layers for every image of directories or globs, into sharded safetensors files and an "
        "index; rerun to resume"
    )
    p = commands.add_parser("features", parents=[client_options()], help=text, description=text)
    p.add_argument("model", help="a model name (`hookserve models` lists them)")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="directories (walked recursively), files or globs")
    p.add_argument("-l", "--layers", action="append", required=True, help="module paths or patterns (comma-separated)")
    p.add_argument("-o", "--out", required=True, help="output directory (index.json, report.json, shards)")
    p.add_argument("--capture", choices=["output", "input", "both"], default="output", help="which side of a layer")
    p.add_argument(
        "--reduce", choices=["mean", "max", "flatten"], default=None, help="reduce each map over its spatial dims"
    )
    p.add_argument("-c", "--concurrency", type=int, default=4, help="requests in flight (default 4)")
    p.add_argument("-b", "--batch-size", type=int, default=8, help="images per request (default 8)")
    p.add_argument("--shard-size", type=int, default=1024, help="files per shard (default 1024)")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (it is off anyway when stderr is no terminal)"
    )
    p.set_defaults(handler=cmd_features, timeout=300.0)
