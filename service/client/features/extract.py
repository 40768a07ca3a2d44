"""`extract_features`: the features of named layers for every image of a directory or glob, into shards.

N requests are in flight at once (`concurrency`), each carrying `batch_size` images as a
multipart upload and asking for a safetensors answer. A request that the server refuses
because of one of its images (400 undecodable, 413 too large, 422 images of different
shapes) is split into one request per image, so that only the bad images fail; they are
listed with the server's reason in `index.json` and `report.json`. Any other error stops
the run: what is written stays, and running again resumes (see `store`).

Shards are planned up front (sorted file names, `shard_size` per shard), so an interrupted
and resumed run writes the same files as an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.client import calls
from service.client.aio import AsyncClient
from service.client.calls import Wire
from service.client.errors import Conflict, HookserveError, detail_text
from service.client.features.sources import list_images
from service.client.features.store import (
    INDEX,
    REPORT,
    VOLATILE_INFO,
    DirectoryLock,
    FeatureIndex,
    Shard,
    digest,
    encode_shard,
    model_identity,
    remove_temporaries,
    shard_intact,
    shard_name,
    write_atomic,
)
from service.client.retry import Retry
from service.client.tensors import Array

PER_IMAGE_STATUSES = (400, 413)  # the answer is about one of the images


class ExtractionMismatch(ValueError):
    """The output directory holds an extraction with other settings or of another model."""


@dataclass(frozen=True)
class FeatureRequest:
    """What to extract: `layers` are module paths or fnmatch patterns, as for /activations."""

    model: str
    layers: tuple[str, ...]
    capture: str = "output"
    reduce: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "layers": list(self.layers), "capture": self.capture, "reduce": self.reduce}


class Progress:
    """Hooks a caller may override to follow a run (the command line draws a progress bar)."""

    def start(self, total: int, done: int) -> None:
        """`total` files in the plan, `done` of them in shards finished by earlier runs."""

    def advance(self, images: int) -> None:
        """`images` more files were answered (or failed)."""

    def shard_written(self, shard: Shard) -> None:
        """A shard and the index recording it are on disk."""


@dataclass
class ExtractionReport:
    """What a run did. `failed` lists every file without features (over all runs) with the reason."""

    out_dir: Path
    files: int
    extracted: int
    resumed: int  # files already in shards from earlier runs, not recomputed
    failed: dict[str, str]
    shards_written: int
    images: int  # files answered during this run
    seconds: float
    complete: bool

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "files": self.files,
            "extracted": self.extracted,
            "resumed": self.resumed,
            "failed": [{"file": name, "reason": why} for name, why in self.failed.items()],
            "shards_written": self.shards_written,
            "images": self.images,
            "seconds": round(self.seconds, 3),
            "images_per_s": round(self.images_per_s, 2),
            "complete": self.complete,
        }


@dataclass
class _Work:
    """A shard being computed: rows by file, failures, and how many planned files are still out."""

    number: int
    shard: Shard
    rows: dict[str, dict[str, Array]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    remaining: int = 0


class _Run:
    """One run over an output directory (state shared by the concurrent workers, on the event loop)."""

    def __init__(
        self,
        client: AsyncClient,
        out_dir: Path,
        *,
        index: FeatureIndex,
        request: FeatureRequest,
        paths: dict[str, Path],
        batch_size: int,
        progress: Progress,
    ) -> None:
        self.client = client
        self.out_dir = out_dir
        self.index = index
        self.request = request
        self.paths = paths
        self.batch_size = batch_size
        self.progress = progress
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hookserve-features-writer")
        self.written: bytes | None = None  # the last index on disk
        self.shards_written = 0
        self.images = 0

    def batches(self, pending: list[_Work]) -> Iterator[tuple[_Work, list[str]]]:
        for work in pending:
            planned = work.shard.files
            for start in range(0, len(planned), self.batch_size):
                yield work, planned[start : start + self.batch_size]

    async def worker(self, batches: Iterator[tuple[_Work, list[str]]]) -> None:
        for work, names in batches:  # every worker pulls from the one iterator: no batch runs twice
            await self.run_batch(work, names)
            self.images += len(names)
            self.progress.advance(len(names))
            work.remaining -= len(names)
            if work.remaining == 0:
                await self.finish(work)

    async def run_batch(self, work: _Work, names: list[str]) -> None:
        contents = await asyncio.to_thread(_read_files, [self.paths.get(n) for n in names])
        readable: list[tuple[str, bytes]] = []
        for name, content in zip(names, contents, strict=True):
            if isinstance(content, str):
                work.failed[name] = content
            else:
                readable.append((name, content))
        if not readable:
            return
        try:
            await self.store(work, readable)
        except HookserveError as exc:
            if not _about_an_image(exc):
                raise
            if len(readable) == 1:
                work.failed[readable[0][0]] = _reason(exc)
                return
            for item in readable:  # find the bad image(s): one request each
                try:
                    await self.store(work, [item])
                except HookserveError as single:
                    if not _about_an_image(single):
                        raise
                    work.failed[item[0]] = _reason(single)

    async def store(self, work: _Work, items: list[tuple[str, bytes]]) -> None:
        req = self.request
        call = calls.activations(
            req.model,
            [content for _, content in items],
            Wire.safetensors,
            layers=req.layers,
            capture=req.capture,
            reduce=req.reduce,
        )
        answer = (await self.client.send(call)).flat()
        for key, array in answer.items():
            if array.shape[0] != len(items):
                raise HookserveError(f"the answer's {key!r} has {array.shape[0]} rows for {len(items)} images")
        if not self.index.tensors:
            self.index.tensors = {k: {"shape": list(a.shape[1:]), "dtype": str(a.dtype)} for k, a in answer.items()}
        expected = {k: (tuple(v["shape"]), v["dtype"]) for k, v in self.index.tensors.items()}
        got = {k: (a.shape[1:], str(a.dtype)) for k, a in answer.items()}
        for row, (name, _) in enumerate(items):
            if got != expected:
                work.failed[name] = (
                    f"its features have shapes {_shapes(got)}, the others {_shapes(expected)} (images of other "
                    "sizes need a model that crops, or a reduce)"
                )
                continue
            work.rows[name] = {k: a[row] for k, a in answer.items()}

    async def finish(self, work: _Work) -> None:
        """Write the shard, then the index that records it, on the writer thread (so a cancelled run still
        completes a write it began, and the event loop never stacks or hashes megabytes)."""
        await asyncio.get_running_loop().run_in_executor(self.writer, self._complete, work)
        self.shards_written += 1
        self.progress.shard_written(work.shard)

    def _complete(self, work: _Work) -> None:
        shard = work.shard
        rows = [name for name in shard.files if name in work.rows]
        data = None
        if rows:
            data = encode_shard(rows, {key: np.stack([work.rows[n][key] for n in rows]) for key in self.index.tensors})
            shard.bytes, shard.sha256 = len(data), digest(data)
        else:
            shard.file = None  # every file failed: no shard file
        shard.status, shard.files, shard.rows = "done", rows, len(rows)
        shard.failed = {n: work.failed[n] for n in sorted(work.failed)}
        work.rows.clear()
        if shard.file is not None and data is not None:
            write_atomic(self.out_dir / shard.file, data)
        self.write_index()

    def write_index(self) -> None:
        """The index as it is now (only the writer thread changes shards once a run has started)."""
        data = self.index.encode()
        write_atomic(self.out_dir / INDEX, data)
        self.written = data


def _read_files(paths: Sequence[Path | None]) -> list[bytes | str]:
    """Each file's bytes, or why it could not be read."""
    out: list[bytes | str] = []
    for path in paths:
        if path is None:
            out.append("no longer among the sources")
            continue
        try:
            content = path.read_bytes()
        except OSError as exc:
            out.append(f"cannot read: {exc.strerror or type(exc).__name__}")
            continue
        out.append(content if content else "empty file")
    return out


def _about_an_image(exc: HookserveError) -> bool:
    if exc.status in PER_IMAGE_STATUSES:
        return True
    return exc.status == 422 and "different shapes" in detail_text(exc.detail)


def _reason(exc: HookserveError) -> str:
    return f"{exc.status} {detail_text(exc.detail)}"


def _shapes(spec: dict[str, tuple[Any, ...]]) -> str:
    return ", ".join(f"{k} {list(shape)}" for k, (shape, _) in sorted(spec.items()))


def _open_index(
    out_dir: Path, info: dict[str, Any], request: FeatureRequest, shard_size: int, batch_size: int
) -> FeatureIndex:
    model = {k: v for k, v in info.items() if k not in VOLATILE_INFO}
    if not (out_dir / INDEX).exists():
        return FeatureIndex(model, request.to_json(), shard_size, batch_size)
    index = FeatureIndex.load(out_dir)
    if not any(shard.done for shard in index.shards):  # only a plan (a typo'd layer stops here): start afresh
        return FeatureIndex(model, request.to_json(), shard_size, batch_size)
    if index.request != request.to_json() or index.shard_size != shard_size:
        raise ExtractionMismatch(
            f"{out_dir} holds an extraction of {index.request} with shard size {index.shard_size}; resume it with "
            "the same model, layers, capture, reduce and shard size, or choose another output directory"
        )
    if model_identity(index.model) != model_identity(model):
        raise ExtractionMismatch(
            f"{out_dir} was extracted from another {request.model!r} ({model_identity(index.model)}); the server's "
            f"is {model_identity(model)}; choose another output directory"
        )
    return index


async def extract_features_async(
    client: AsyncClient,
    sources: Sequence[str | Path],
    out_dir: str | Path,
    request: FeatureRequest,
    *,
    concurrency: int = 4,
    batch_size: int = 8,
    shard_size: int = 1024,
    progress: Progress | None = None,
) -> ExtractionReport:
    """Extract (or resume extracting) the features of every file of `sources` into `out_dir`."""
    if concurrency < 1 or batch_size < 1 or shard_size < 1:
        raise ValueError("concurrency, batch_size and shard_size must be at least 1")
    progress = progress or Progress()
    out = Path(out_dir)
    found = list_images(sources, exclude=out)
    info = (await client.model(request.model)).to_json()
    info.pop("repr", None)
    if info.get("status") != "ready":
        raise Conflict(f"model {request.model!r} is {info.get('status')}: {info.get('error')}")
    out.mkdir(parents=True, exist_ok=True)
    with DirectoryLock(out):
        return await _extract(
            client,
            out,
            found=found,
            info=info,
            request=request,
            concurrency=concurrency,
            batch_size=batch_size,
            shard_size=shard_size,
            progress=progress,
        )


async def _extract(
    client: AsyncClient,
    out: Path,
    *,
    found: list[tuple[str, Path]],
    info: dict[str, Any],
    request: FeatureRequest,
    concurrency: int,
    batch_size: int,
    shard_size: int,
    progress: Progress,
) -> ExtractionReport:
    remove_temporaries(out)
    index = _open_index(out, info, request, shard_size, batch_size)
    index.plan([key for key, _ in found])
    pending = [_Work(n, s) for n, s in enumerate(index.shards) if not shard_intact(out, s)]
    for work in pending:
        if work.shard.done:  # its file went missing or changed size: planned again
            work.shard = index.shards[work.number] = Shard(shard_name(work.number), files=work.shard.planned())
        work.remaining = len(work.shard.files)
    resumed = sum(len(s.planned()) for s in index.shards) - sum(w.remaining for w in pending)
    run = _Run(client, out, index=index, request=request, paths=dict(found), batch_size=batch_size, progress=progress)
    started = time.perf_counter()
    progress.start(resumed + sum(w.remaining for w in pending), resumed)
    try:
        await asyncio.get_running_loop().run_in_executor(run.writer, run.write_index)  # the plan, before any work
        batches = run.batches(pending)
        workers = [asyncio.ensure_future(run.worker(batches)) for _ in range(concurrency)]
        try:
            done, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        for task in done:
            task.result()  # the first error, if any
    finally:
        run.writer.shutdown(wait=True)  # an interrupted shard write still completes, with its index
        if run.written is not None:
            final = FeatureIndex.from_json(_loads(run.written))
            write_atomic(out / REPORT, _dumps(final.report()))
    return ExtractionReport(
        out_dir=out,
        files=sum(len(s.planned()) for s in index.shards),
        extracted=index.rows(),
        resumed=resumed,
        failed=index.failed(),
        shards_written=run.shards_written,
        images=run.images,
        seconds=time.perf_counter() - started,
        complete=index.complete,
    )


def extract_features(
    url: str,
    sources: Sequence[str | Path],
    out_dir: str | Path,
    model: str,
    layers: Sequence[str],
    *,
    capture: str = "output",
    reduce: str | None = None,
    concurrency: int = 4,
    batch_size: int = 8,
    shard_size: int = 1024,
    timeout: float | None = 300.0,
    retry: Retry | None = None,
    progress: Progress | None = None,
) -> ExtractionReport:
    """The blocking form of `extract_features_async`, with its own client for `url`.

    >>> report = extract_features(  # doctest: +SKIP
    ...     "http://127.0.0.1:8000", ["digits/"], "features/", "lenet", ["fc1"], capture="input"
    ... )
    >>> report.extracted, report.failed  # doctest: +SKIP
    (1797, {})
    """
    request = FeatureRequest(model, tuple(layers), capture, reduce)

    async def run() -> ExtractionReport:
        async with AsyncClient(url, timeout=timeout, retry=retry) as client:
            return await extract_features_async(
                client,
                sources,
                out_dir,
                request,
                concurrency=concurrency,
                batch_size=batch_size,
                shard_size=shard_size,
                progress=progress,
            )

    return asyncio.run(run())


def _loads(data: bytes) -> Any:
    import json

    return json.loads(data)


def _dumps(data: Any) -> bytes:
    import json

    return (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode()
