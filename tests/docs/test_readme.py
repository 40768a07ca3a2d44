"""Every curl line and Python example of the README, run against a live server: none may fail, and every
answer the README prints is the answer the server gives (`tests.helpers.printed` says how they compare)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.printed import mismatches, output_mismatches, parse_printed, text_mismatches
from tests.reliability.live_server import REPO_ROOT, LiveServer, free_port
from tests.torchserve.archives import build_sources, eager_archive, kitten

README = REPO_ROOT / "README.md"
DOC_ADDRESS = "http://127.0.0.1:8000"
DOC_HOST = "127.0.0.1:8000"
DOC_GRPC = "127.0.0.1:8001"  # gRPC, and TorchServe's management API, on the ports the README names
DOC_MANAGEMENT = "http://127.0.0.1:8081"
DOC_ARCHIVE = "resnet-18"  # the archive the README registers: the tests' tiny image classifier, by that name
TOKEN = "readme-token"
STATUS = re.compile(r"__STATUS__(\d{3})")
ENDPOINTS = (
    *("/predict", "/activations", "/gradients", "/saliency", "/models", "/layers", "/summary", "/state-dict"),
    *("/optimizer", "/checkpoints/inspect", "/healthz", "/readyz", "/metrics", "/v2/"),
)
ANSWER_LANGUAGES = ("json", "")  # fenced blocks that print an answer; the others are commands or configs


@dataclass(frozen=True)
class Block:
    """A fenced block of the README and the prose right before it."""

    language: str
    text: str
    before: str


def readme_blocks() -> list[Block]:
    text = README.read_text()
    blocks, end = [], 0
    for match in re.finditer(r"```(\w*)\n(.*?)```", text, flags=re.DOTALL):
        blocks.append(Block(match.group(1), match.group(2), text[end : match.start()]))
        end = match.end()
    return blocks


def _blocks(language: str) -> list[str]:
    return [b.text for b in readme_blocks() if b.language == language]


def curl_lines() -> list[str]:
    lines = [line.strip() for block in _blocks("bash") for line in block.splitlines()]
    inline = re.findall(r"`(curl [^`]+)`", README.read_text())
    return [line for line in lines if line.startswith("curl ")] + inline


def prints(line: str) -> bool:
    """Whether the curl line prints its answer (rather than writing a file with -o)."""
    return " -o " not in f" {line} "


def printed_answers() -> list[tuple[str, Block]]:
    """Each printed answer and the curl line that gives it.

    A block right after a bash block answers that block's last printing curl line; a block after
    prose that starts with a path in backticks (`/summary` gives ...) answers the curl line for that path.
    """
    blocks = readme_blocks()
    pairs = []
    for index, block in enumerate(blocks):
        if block.language not in ANSWER_LANGUAGES:
            continue
        named = re.match(r"`(/[\w/-]+)`", block.before.strip().split("\n\n")[-1])
        if named is not None:
            candidates = [c for c in curl_lines() if prints(c) and re.search(rf"{named.group(1)}\b", c)]
        elif not block.before.strip() and index > 0 and blocks[index - 1].language == "bash":
            candidates = [c.strip() for c in blocks[index - 1].text.splitlines() if c.strip().startswith("curl ")]
            candidates = [c for c in candidates if prints(c)][-1:]
        else:
            candidates = []
        assert len(candidates) == 1, f"README block {block.text[:60]!r}: which curl line prints it? {candidates}"
        pairs.append((candidates[0], block))
    return pairs


def python_outputs() -> list[tuple[str, str]]:
    """Each Python example and the output it prints, given as `# ...` comment lines after its last line of code."""
    out = []
    for code in _blocks("python"):
        lines = code.rstrip("\n").splitlines()
        comments: list[str] = []
        while lines and lines[-1].startswith("# "):
            comments.insert(0, lines.pop().removeprefix("# "))
        if comments:
            out.append((code, "\n".join(comments)))
    return out


@dataclass(frozen=True)
class Ports:
    grpc: int
    management: int


PORTS = Ports(free_port(), free_port())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    models = tmp_path_factory.mktemp("models")
    eager_archive(build_sources(tmp_path_factory.mktemp("archive")), models, name=DOC_ARCHIVE)
    env = {
        "HOOKSERVE_ADMIN_TOKEN": TOKEN,
        "HOOKSERVE_GRPC_PORT": str(PORTS.grpc),
        "HOOKSERVE_TORCHSERVE_MANAGEMENT_PORT": str(PORTS.management),
    }
    with LiveServer(models, None, env=env) as live:
        yield live


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where the examples run: `service/` as in a checkout, a `kitten.jpg`, output files land in a temp dir."""
    (tmp_path / "service").symlink_to(REPO_ROOT / "service")
    (tmp_path / ".curlrc").write_text('write-out = "%{stderr}__STATUS__%{http_code}\\n"\n')
    (tmp_path / "kitten.jpg").write_bytes(kitten())
    return tmp_path


def run_curl(server: LiveServer, workdir: Path, line: str) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    """Run one README curl line against `server`; the process and the HTTP statuses curl reported."""
    command = line.replace(DOC_ADDRESS, server.base_url).replace(DOC_MANAGEMENT, f"http://127.0.0.1:{PORTS.management}")
    env = {**os.environ, "CURL_HOME": str(workdir), "HOOKSERVE_ADMIN_TOKEN": TOKEN}
    done = subprocess.run(
        ["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, (command, done.stderr[-2000:], server.log())
    return done, [int(code) for code in STATUS.findall(done.stderr)]


def run_python(server: LiveServer, code: str) -> subprocess.CompletedProcess[str]:
    script = code.replace(DOC_HOST, f"127.0.0.1:{server.port}").replace(DOC_GRPC, f"127.0.0.1:{PORTS.grpc}")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_the_readme_has_examples_for_every_endpoint() -> None:
    text = " ".join(curl_lines())
    for path in ENDPOINTS:
        assert path in text, f"no curl example for {path}"


def test_the_readme_prints_answers_to_compare() -> None:
    """The pairing below finds the README's printed answers (if it found none, nothing would be compared)."""
    answered = {m.group(1) for line, _ in printed_answers() if (m := re.search(rf"{DOC_ADDRESS}(/[\w/]+)", line))}
    assert {"/predict", "/activations", "/saliency", "/models/lenet/summary", "/models/lenet/optimizer"} <= answered
    assert python_outputs(), "no printed output of a Python example"


@pytest.mark.parametrize("line", curl_lines())
def test_curl_example_succeeds(server: LiveServer, workdir: Path, line: str) -> None:
    done, statuses = run_curl(server, workdir, line)
    assert statuses, f"curl reported no status: {done.stderr[-500:]}"
    assert all(code < 400 for code in statuses), (statuses, done.stdout[-2000:])


@pytest.mark.parametrize(("line", "block"), printed_answers(), ids=[line[:80] for line, _ in printed_answers()])
def test_printed_answer_is_the_servers(server: LiveServer, workdir: Path, line: str, block: Block) -> None:
    done, statuses = run_curl(server, workdir, line)
    assert statuses == [200], done.stdout[-2000:]
    answer = json.loads(done.stdout)
    if block.language == "json":
        problems = mismatches(parse_printed(block.text), answer)
    else:  # a table printed as text: the answer's `text`
        problems = text_mismatches(block.text, answer["text"] if isinstance(answer, dict) else done.stdout)
    assert not problems, problems


@pytest.mark.parametrize("code", _blocks("python"))
def test_python_example_runs(server: LiveServer, code: str) -> None:
    run_python(server, code)


@pytest.mark.parametrize(("code", "printed"), python_outputs())
def test_python_example_prints_what_the_readme_shows(server: LiveServer, code: str, printed: str) -> None:
    problems = output_mismatches(printed, run_python(server, code).stdout)
    assert not problems, problems
