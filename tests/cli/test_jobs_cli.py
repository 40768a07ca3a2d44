"""`hookserve jobs` against a live server: start a data-set job and follow it, list and show jobs, read and download
a result byte for byte, cancel and delete; unknown ids and a missing token fail in one line with their exit status."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cli.errors import CliError
from service.cli.jobs import Bar, ended
from service.cli.main import build_parser
from service.client import Client
from service.client.features import read_features
from tests.cli.conftest import Hookserve
from tests.client.servers import TOKEN
from tests.reliability.live_server import REPO_ROOT, LiveServer

JOB_ID = re.compile(r"[0-9a-f]{16}")


@pytest.fixture
def url(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The server and the admin token, given the way a person would: HOOKSERVE_URL and HOOKSERVE_ADMIN_TOKEN."""
    monkeypatch.setenv("HOOKSERVE_URL", live.base_url)
    monkeypatch.setenv("HOOKSERVE_ADMIN_TOKEN", TOKEN)
    return live.base_url


def server_file(url: str, job_id: str, name: str) -> bytes:
    """GET /jobs/{id}/files/{name}, without the client the command uses."""
    answer = httpx.get(f"{url}/jobs/{job_id}/files/{name}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.content


def test_a_job_started_and_followed_to_its_result(hookserve: Hookserve, url: str, tmp_path: Path) -> None:
    started = hookserve("jobs", "start", "unit_stats", "lenet", "digits", "-l", "conv1", "--limit", 64, "--wait")
    assert started.status == 0, started.err
    job_id, summary = started.out.splitlines()
    assert JOB_ID.fullmatch(job_id), started.out
    assert re.fullmatch(rf"job {job_id} succeeded: 64 of 64 samples in \d+\.\d s", summary), summary
    with Client(url, token=TOKEN) as client:
        job = client.job(job_id)
        expected = client.job_result(job_id)
    assert (job["kind"], job["state"], job["done"], job["total"]) == ("unit_stats", "succeeded", 64, 64)

    listed = hookserve("jobs", "list")
    assert listed.status == 0, listed.err
    assert listed.out.splitlines()[0].split() == ["id", "kind", "model", "dataset", "state", "done/total"]
    rows = {line.split()[0]: line.split() for line in listed.out.splitlines()[2:]}
    assert rows[job_id] == [job_id, "unit_stats", "lenet", "digits", "succeeded", "64/64"]
    assert job_id in [j["id"] for j in json.loads(hookserve("jobs", "list", "--json").out)]

    shown = json.loads(hookserve("jobs", "show", job_id, "--json").out)
    assert (shown["id"], shown["state"], shown["done"], shown["layers"]) == (job_id, "succeeded", 64, ["conv1"])
    table = hookserve("jobs", "show", job_id).out
    assert re.search(r"^state +succeeded$", table, re.MULTILINE), table
    assert re.search(r"^progress +64 of 64 samples \(100%\)$", table, re.MULTILINE), table
    assert re.search(r"^parameters +bins=32 range=null$", table, re.MULTILINE), table

    result = hookserve("jobs", "result", job_id)
    assert result.status == 0, result.err
    assert json.loads(result.out) == expected
    assert set(expected["layers"]["conv1"]) >= {"mean", "std"}

    written = hookserve("jobs", "result", job_id, "-o", tmp_path / "stats")
    assert written.status == 0, written.err
    assert written.out.splitlines()[-1] == f"wrote 1 file into {tmp_path / 'stats'}"
    assert sorted(p.name for p in (tmp_path / "stats").iterdir()) == ["result.json"]
    assert (tmp_path / "stats" / "result.json").read_bytes() == server_file(url, job_id, "result.json")


def test_a_features_job_downloads_every_file_byte_for_byte(hookserve: Hookserve, url: str, tmp_path: Path) -> None:
    started = hookserve(
        "jobs", "start", "features", "lenet", "digits", "-l", "fc3", "--limit", 40, "-p", "shard_size=16", "--wait",
        "--json",
    )  # fmt: skip
    assert started.status == 0, started.err
    job = json.loads(started.out)
    assert (job["state"], job["parameters"]["shard_size"]) == ("succeeded", 16)
    out = tmp_path / "features"
    written = hookserve("jobs", "result", job["id"], "-o", out, "--json")
    assert written.status == 0, written.err
    answer = json.loads(written.out)
    names = [Path(f["file"]).name for f in answer["files"]]
    assert names == [
        "index.json", "features-00000.safetensors", "features-00001.safetensors", "features-00002.safetensors",
        "result.json",
    ]  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    for f in answer["files"]:
        data = server_file(url, job["id"], Path(f["file"]).name)
        assert Path(f["file"]).read_bytes() == data
        assert f["bytes"] == len(data)
    rows, x = read_features(out)
    assert rows == [f"digits/{i}" for i in range(40)]
    assert x.shape == (40, 10)


def test_cancel_wait_and_delete(hookserve: Hookserve, url: str) -> None:
    with Client(url, token=TOKEN) as client:
        job_id = client.start_job("exemplars", "lenet", "digits", ["conv1"])["id"]  # all 1797 digits: still running
    cancelled = hookserve("jobs", "cancel", job_id)
    assert cancelled.status == 0, cancelled.err
    assert re.fullmatch(rf"cancelled job {job_id} after \d+ of 1797 samples\n", cancelled.out), cancelled.out
    assert json.loads(hookserve("jobs", "show", job_id, "--json").out)["state"] == "cancelled"

    waited = hookserve("jobs", "wait", job_id)
    assert waited.status == 3
    assert re.fullmatch(rf"hookserve: error: job {job_id} was cancelled after \d+ of 1797 samples\n", waited.err)
    no_result = hookserve("jobs", "result", job_id)
    assert (no_result.status, no_result.out) == (3, "")
    assert no_result.err == (
        f"hookserve: error: 409 job {job_id} is cancelled; its result exists once it has succeeded\n"
    )

    again = hookserve("jobs", "cancel", job_id)  # a finished job is kept unless --delete says otherwise
    assert (again.status, again.out) == (2, "")
    assert again.err == (
        f"hookserve: error: job {job_id} already cancelled; `hookserve jobs cancel {job_id} --delete` deletes it "
        "and its files\n"
    )
    assert json.loads(hookserve("jobs", "show", job_id, "--json").out)["state"] == "cancelled"
    deleted = hookserve("jobs", "cancel", job_id, "--delete")
    assert deleted.status == 0, deleted.err
    assert deleted.out == f"deleted job {job_id} (cancelled) and its files\n"
    gone = hookserve("jobs", "show", job_id)
    assert (gone.status, gone.err) == (
        3,
        f"hookserve: error: 404 no job '{job_id}'; `hookserve jobs list` lists them\n",
    )


def test_unknown_jobs_are_one_line_404s(hookserve: Hookserve, url: str) -> None:
    for verb in ("show", "wait", "result", "cancel"):
        found = hookserve("jobs", verb, "nope")
        assert (found.status, found.out) == (3, ""), verb
        assert found.err == "hookserve: error: 404 no job 'nope'; `hookserve jobs list` lists them\n", verb
    as_json = hookserve("jobs", "show", "nope", "--json")
    assert (as_json.status, as_json.err) == (3, "")
    assert json.loads(as_json.out)["error"]["status"] == 404


def test_jobs_need_the_token(hookserve: Hookserve, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOOKSERVE_ADMIN_TOKEN")
    expected = "hookserve: error: 401 admin call needs 'Authorization: Bearer <token>'\n"
    for argv in (("list",), ("start", "unit_stats", "lenet", "digits", "-l", "conv1", "--limit", "8")):
        denied = hookserve("jobs", *argv)
        assert (denied.status, denied.out, denied.err) == (3, "", expected), argv
    as_json = hookserve("jobs", "list", "--json")
    assert as_json.status == 3
    assert json.loads(as_json.out)["error"] == {
        "exit": 3,
        "status": 401,
        "message": "401 admin call needs 'Authorization: Bearer <token>'",
        "errors": [],
    }
    monkeypatch.setenv("HOOKSERVE_ADMIN_TOKEN", "wrong")
    assert hookserve("jobs", "list").status == 3


def test_start_refuses_bad_usage_before_asking(hookserve: Hookserve) -> None:
    kind = hookserve("jobs", "start", "unit_stat", "lenet", "digits", "-l", "conv1", "--url", "http://127.0.0.1:9")
    assert kind.status == 2
    assert kind.err.splitlines()[-1].endswith("; did you mean 'unit_stats'?")
    no_layer = hookserve("jobs", "start", "unit_stats", "lenet", "digits")
    assert no_layer.status == 2
    assert "the following arguments are required: -l/--layers" in no_layer.err
    assert hookserve("jobs").status == 2


def test_parameters_are_json_but_class_names_stay_text() -> None:
    args = build_parser().parse_args(
        ["jobs", "start", "steering_vector", "lenet", "digits", "-l", "fc1", "-p", "positive=3", "-p", "negative=7",
         "-p", "name=3-7", "-p", "range=[0,4]", "-p", "bins=8", "-l", "fc2,fc3"]
    )  # fmt: skip
    assert dict(args.param) == {"positive": "3", "negative": "7", "name": "3-7", "range": [0, 4], "bins": 8}
    assert args.layers == ["fc1", "fc2,fc3"]


def job_state(state: str, **extra: Any) -> dict[str, Any]:
    return {"id": "abc", "state": state, "done": 5, "total": 10, "error_count": 0, **extra}


def test_a_failed_or_cancelled_job_is_an_error() -> None:
    args = argparse.Namespace(json=False)
    with pytest.raises(CliError, match=r"^job abc failed: out of memory$") as failed:
        ended(job_state("failed", error="out of memory"), args)
    assert failed.value.code == 3
    with pytest.raises(CliError, match=r"^job abc was cancelled after 5 of 10 samples$") as cancelled:
        ended(job_state("cancelled"), args)
    assert cancelled.value.code == 3


def test_the_bar_counts_samples_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    bar = Bar(True)
    bar.show(job_state("running", done=3, error_count=2))
    bar.show(job_state("succeeded", done=10))
    bar.close()
    err = capsys.readouterr().err
    assert "job abc" in err
    assert "10/10" in err
    assert "running, 2 skipped" in err
    assert "succeeded" in err
    quiet = Bar(False)
    quiet.show(job_state("running"))
    quiet.close()
    assert capsys.readouterr().err == ""


def test_every_argument_of_every_jobs_verb_has_help() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (verbs,) = [a for a in commands.choices["jobs"]._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(verbs.choices) == {"start", "list", "show", "wait", "result", "cancel"}
    missing = [
        f"jobs {name} {action.dest}"
        for name, sub in verbs.choices.items()
        for action in sub._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert missing == []


def test_the_readmes_jobs_lines_parse() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", (REPO_ROOT / "README.md").read_text(), flags=re.DOTALL)
    lines = [
        line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("hookserve jobs")
    ]
    verbs = set()
    for line in lines:
        argv = shlex.split(line.partition("#")[0])[1:]
        verbs.add(build_parser().parse_args(argv).verb)
    assert verbs == {"start", "list", "show", "wait", "result", "cancel"}


def test_the_commands_job_vocabulary_is_the_servers() -> None:
    """jobs.py spells the kinds and states itself (the CLI imports nothing of the server): they must match."""
    from service.cli import jobs
    from service.specs.vocab import JobKindName, JobState

    assert list(jobs.KIND_PARAMETERS) == [k.value for k in JobKindName]
    assert {*jobs.ACTIVE, jobs.FAILED, jobs.CANCELLED} <= {s.value for s in JobState}
