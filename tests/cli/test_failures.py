"""How `hookserve` fails, run as its own process against a live server: one line naming the fix (the closest
spelling, the file behind an input index), one JSON object under --json, and an exit status per kind of failure."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from service.cli.errors import EXIT_CODES
from service.cli.main import build_parser
from service.introspection.attribution.base import registered_methods
from service.zoo.lenet import samples_dir
from tests.cli.conftest import Hookserve, run_process
from tests.reliability.live_server import free_port

DIGIT_7 = samples_dir() / "digit_7.png"


def test_each_kind_of_failure_has_its_exit_status(shell: Hookserve, tmp_path: Path) -> None:
    assert shell("predict", "lenet", DIGIT_7).status == 0
    assert shell("predict", "lenet", tmp_path / "none.png").status == 1
    assert shell("predict", "lenet").status == 2
    assert shell("predict", "lenett", DIGIT_7).status == 3
    assert shell("predict", "lenet", DIGIT_7, "--url", f"http://127.0.0.1:{free_port()}", "--retries", "0").status == 4


def test_the_exit_statuses_are_in_the_help_and_the_readme() -> None:
    text = run_process("--help").out
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for code, meaning in EXIT_CODES.items():
        assert f"{code} {meaning}" in " ".join(text.split())
        assert f"| {code} | {meaning} |" in readme


def test_usage_errors_name_the_closest_command_option_and_choice(shell: Hookserve) -> None:
    command = shell("predcit", "lenet", DIGIT_7)
    assert command.status == 2
    assert command.err.splitlines()[-1].endswith("; did you mean 'predict'?")
    option = shell("predict", "lenet", DIGIT_7, "--jsno")
    assert (option.status, option.err.splitlines()[-1]) == (
        2,
        "hookserve: error: unrecognized arguments: --jsno; did you mean '--json'?",
    )
    choice = shell("activations", "lenet", DIGIT_7, "-l", "conv1", "--capture", "inptu")
    assert choice.err.splitlines()[-1].endswith("; did you mean 'input'?")


def test_a_url_without_its_scheme_says_which_one(shell: Hookserve) -> None:
    found = shell("models", "--url", "localhost:8241")
    assert (found.status, found.err) == (
        2,
        "hookserve: error: --url 'localhost:8241' has no http:// or https://; did you mean 'http://localhost:8241'?\n",
    )


def test_an_unknown_model_gets_the_closest_name_and_the_command_that_lists_them(shell: Hookserve) -> None:
    found = shell("predict", "lenett", DIGIT_7)
    assert found.err == (
        "hookserve: error: 404 no model named 'lenett'; did you mean 'lenet'? `hookserve models` lists them\n"
    )


def test_an_undecodable_input_is_named_by_its_file(shell: Hookserve, tmp_path: Path) -> None:
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    found = shell("predict", "lenet", DIGIT_7, bad)
    assert found.status == 3
    assert f"image[1] ({bad}) is not a decodable image" in found.err


def test_errors_under_json_are_json_on_stdout(shell: Hookserve) -> None:
    refused = shell("predict", "lenet", DIGIT_7, "-k", "0", "--json")
    assert (refused.status, refused.err) == (3, "")
    error = json.loads(refused.out)["error"]
    assert (error["exit"], error["status"]) == (3, 422)
    assert error["message"].startswith("422 top_k: ")
    assert [e["loc"] for e in error["errors"]] == [["top_k"]]
    gone = shell("models", "--json", "--url", f"http://127.0.0.1:{free_port()}", "--retries", "0")
    assert (gone.status, json.loads(gone.out)["error"]["exit"], json.loads(gone.out)["error"]["status"]) == (4, 4, None)
    usage = shell("predict", "lenet", DIGIT_7, "--json", "--top-k", "x")
    assert (usage.status, json.loads(usage.out)["error"]["exit"]) == (2, 2)


def test_an_output_into_a_missing_folder_is_one_line_before_any_request(shell: Hookserve, tmp_path: Path) -> None:
    for name in ("acts.safetensors", "acts.npz", "acts.png"):
        out = tmp_path / "missing" / name
        found = shell("activations", "lenet", DIGIT_7, "-l", "conv1", "-o", out)
        assert (found.status, found.out) == (1, "")
        assert found.err == f"hookserve: error: -o {out}: no folder {str(out.parent)!r}; create it first\n"
    saliency = shell("saliency", "lenet", DIGIT_7, "-o", tmp_path / "missing" / "s.safetensors")
    assert saliency.status == 1
    assert "Traceback" not in saliency.err


def test_bare_hookserve_prints_help_and_serves_nothing() -> None:
    found = run_process()
    assert found.status == 0
    assert found.out.startswith("usage: hookserve ")
    assert "COMMAND" in found.out


def test_help_names_its_program_and_shows_defaults() -> None:
    assert run_process("serve", "--help").out.startswith("usage: hookserve serve ")
    predict = " ".join(run_process("predict", "--help").out.split())
    assert "-k TOP_K, --top-k TOP_K classes per input (default: 5)" in predict
    assert "--timeout TIMEOUT seconds per request (default: 120.0)" in predict


def test_saliency_help_names_real_methods_and_a_working_example(shell: Hookserve) -> None:
    text = " ".join(run_process("saliency", "--help").out.split())
    assert "/saliency/methods" not in text
    listed = re.search(r"-m METHOD, --method METHOD (.*?), \.\.\.", text)
    assert listed is not None
    assert set(listed.group(1).split(", ")) <= set(registered_methods())
    example = re.search(r"\(e\.g\. (-m occlusion .*?)\)", text)
    assert example is not None
    found = shell("saliency", "lenet", DIGIT_7, *example.group(1).split())
    assert found.status == 0, found.err


def test_every_argument_of_every_command_has_help() -> None:
    parser = build_parser()
    commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [
        f"{name} {action.dest}"
        for command in commands
        for name, sub in command.choices.items()
        for action in sub._actions
        if not action.help and not isinstance(action, argparse._HelpAction) and name != "serve"
    ]
    assert missing == []
