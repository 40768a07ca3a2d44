"""gradients, interventions, sweep and nodes from the shell: each prints a table, and under --json what the client
returns for the same call."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from service.cli.gradients import gradient_stats
from service.client import Client
from service.zoo.lenet import samples_dir
from tests.cli.conftest import Hookserve
from tests.reliability.live_server import LiveServer

DIGIT_7 = samples_dir() / "digit_7.png"
DIGIT_3 = samples_dir() / "digit_3.png"
EDIT = '{"site": "conv2", "op": "zero", "channels": [15]}'


def test_gradients_table_json_and_arrays(shell: Hookserve, live: LiveServer, tmp_path: Path) -> None:
    with Client(live.base_url) as client:
        expected = client.gradients("lenet", DIGIT_7, layers=["conv1", "fc3"])
    table = shell("gradients", "lenet", DIGIT_7, "-l", "conv1,fc3")
    assert table.status == 0, table.err
    assert [line.split()[0] for line in table.out.splitlines()[6:]] == ["conv1", "fc3", "input"]
    answer = json.loads(shell("gradients", "lenet", DIGIT_7, "-l", "conv1,fc3", "--json").out)
    assert (answer["targets"], answer["scores"]) == (expected.targets, expected.scores)
    assert answer["gradients"] == {k: gradient_stats(g) for k, g in expected.gradients.items()}
    out = tmp_path / "grads.safetensors"
    written = shell("gradients", "lenet", DIGIT_7, "-l", "conv1", "--no-input", "-o", out)
    assert written.status == 0, written.err
    assert set(load_file(str(out))) == {"conv1"}
    np.testing.assert_array_equal(load_file(str(out))["conv1"], expected.gradients["conv1"])


def test_interventions_table_and_json(shell: Hookserve, live: LiveServer) -> None:
    with Client(live.base_url) as client:
        expected = client.interventions("lenet", [DIGIT_7, DIGIT_3], [json.loads(EDIT)])
    table = shell("interventions", "lenet", DIGIT_7, DIGIT_3, "-e", EDIT)
    assert table.status == 0, table.err
    rows = [line.split() for line in table.out.splitlines()[2:]]
    assert [(r[1], r[-2], r[-1]) for r in rows] == [
        (c.label, b.top1.label, a.top1.label)
        for c, b, a in zip(expected.change, expected.clean, expected.edited, strict=True)
    ]
    answer = json.loads(shell("interventions", "lenet", DIGIT_7, DIGIT_3, "-e", EDIT, "--json").out)
    assert [c["delta"] for c in answer["change"]] == [c.delta for c in expected.change]
    bad = shell("interventions", "lenet", DIGIT_7, "-e", "{site: conv2}")
    assert bad.status == 2
    assert "takes a JSON edit" in bad.err


def test_sweep_ranks_channels(shell: Hookserve, live: LiveServer) -> None:
    with Client(live.base_url) as client:
        expected = client.sweep("lenet", DIGIT_7, "conv2")
    table = shell("sweep", "lenet", DIGIT_7, "-s", "conv2", "--top", "3")
    assert table.status == 0, table.err
    lines = table.out.splitlines()
    assert [int(line.split()[1]) for line in lines[2:5]] == [c.channel for c in expected.channels[:3]]
    count = len(expected.channels)
    assert lines[5] == f"... {count - 3} more (--top {count} or --json shows every one)"
    answer = json.loads(shell("sweep", "lenet", DIGIT_7, "-s", "conv2", "--json").out)
    assert [c["channel"] for c in answer["channels"]] == [c.channel for c in expected.channels]


def test_nodes_table_and_json(shell: Hookserve, live: LiveServer) -> None:
    with Client(live.base_url) as client:
        expected = client.nodes("lenet")
    assert expected.input_size == [1, 3, 32, 32]
    assert [n.name for n in expected.nodes][:2] == ["x", "conv1"]
    table = shell("nodes", "lenet")
    assert table.status == 0, table.err
    assert [line.split()[0] for line in table.out.splitlines()[2:]] == [n.name for n in expected.nodes]
    answer = json.loads(shell("nodes", "lenet", "--json").out)
    assert [n["shape"] for n in answer["nodes"]] == [n.shape for n in expected.nodes]


def test_summary_text_names_its_units(shell: Hookserve) -> None:
    found = shell("summary", "lenet")
    assert found.status == 0, found.err
    assert "Units." not in found.out
    assert "Total mult-adds (M): 0.66" in found.out
