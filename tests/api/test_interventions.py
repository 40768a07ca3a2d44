"""POST /interventions and /interventions/sweep against direct computations with hand-registered hooks."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from torch import Tensor, nn

from service.registry.loader import use_channels_last
from service.specs.model import MemoryFormat
from service.zoo.lenet import LeNet
from tests.conftest import ClientFactory, as_tensor, digit_pixels, hooks, tensor_input, write_lenet

BRANCHY_PY = '''
import torch
from torch import nn

class Branchy(nn.Module):
    """`maybe` runs only for inputs whose mean is below 10 (the load-time probe's random input is)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.maybe = nn.ReLU()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = self.conv(x)
        if float(x.mean()) < 10:
            y = self.maybe(y)
        return self.fc(y.mean((2, 3)))
'''

BRANCHY_TOML = """
[[models]]
name = "branchy"
source = "python"
architecture = "branchy.py:Branchy"
input_size = [3, 8, 8]
"""

Edit = Callable[[Tensor], Tensor]


@pytest.fixture
def lenet_client(make_client: ClientFactory, tmp_path: Path) -> TestClient:
    (tmp_path / "branchy.py").write_text(BRANCHY_PY)
    return make_client(write_lenet(tmp_path) + BRANCHY_TOML, max_edits=4, max_sweep_rows=10)


def as_served(model: nn.Module, x: Tensor) -> tuple[nn.Module, Tensor]:
    """The model and input in the memory format the server runs them in (the same kernels)."""
    if use_channels_last(MemoryFormat.auto, model, list(x.shape[1:])):
        return copy.deepcopy(model).to(memory_format=torch.channels_last), x.contiguous(
            memory_format=torch.channels_last
        )
    return model, x


def edited_logits(model: nn.Module, x: Tensor, edits: dict[str, Edit]) -> Tensor:
    """The model's logits with each named layer's (first call's) output replaced by `edit(output)`."""
    model, x = as_served(model, x)
    handles = []
    for name, edit in edits.items():
        done = [False]

        def hook(module: nn.Module, args: Any, output: Tensor, edit: Edit = edit, done: list[bool] = done) -> Tensor:
            if done[0]:
                return output
            done[0] = True
            return edit(output.clone())

        handles.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        with torch.inference_mode():
            logits: Tensor = model(x).float()
            return logits
    finally:
        for handle in handles:
            handle.remove()


def post(client: TestClient, path: str, **body: Any) -> dict[str, Any]:
    response = client.post(path, json={"model": "lenet", **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def logits_of(answer: dict[str, Any], key: str) -> Tensor:
    return torch.tensor([p["logits"] for p in answer[key]])


def zeroed(channels: list[int]) -> Edit:
    def edit(t: Tensor) -> Tensor:
        t[:, channels] = 0
        return t

    return edit


def region(channels: list[int], y: tuple[int, int], x: tuple[int, int], fn: Edit) -> Edit:
    def edit(t: Tensor) -> Tensor:
        t[:, channels, y[0] : y[1], x[0] : x[1]] = fn(t[:, channels, y[0] : y[1], x[0] : x[1]])
        return t

    return edit


STEER = torch.linspace(-1, 1, 16)
SET = torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(2, 3, 3)
CASES: list[tuple[str, dict[str, Any], dict[str, Edit]]] = [
    ("zero", {"site": "conv2", "op": "zero", "channels": [0, 5, 9]}, {"conv2": zeroed([0, 5, 9])}),
    ("scale", {"site": "fc1", "op": "scale", "factor": -2.5}, {"fc1": lambda t: t * -2.5}),
    (
        "add-scalar-region",
        {"site": "conv1", "op": "add", "value": 3.0, "channels": [1, 2], "y": [4, 20], "x": [0, 10]},
        {"conv1": region([1, 2], (4, 20), (0, 10), lambda r: r + 3.0)},
    ),
    (
        "add-per-channel",
        {"site": "conv2", "op": "add", "tensor": tensor_input(STEER)["tensor"]},
        {"conv2": lambda t: t + STEER.reshape(1, 16, 1, 1)},
    ),
    ("clamp", {"site": "fc2", "op": "clamp", "min": -0.5, "max": 0.5}, {"fc2": lambda t: t.clamp(-0.5, 0.5)}),
    (
        "mean-spatial",
        {"site": "conv1", "op": "mean", "channels": [3]},
        {
            "conv1": lambda t: torch.cat(
                [t[:, :3], t[:, 3:4].mean((2, 3), keepdim=True).expand_as(t[:, 3:4]), t[:, 4:]], 1
            )
        },
    ),
    (
        "set-region",
        {
            "site": "conv2",
            "op": "set",
            "channels": [2, 7],
            "y": [1, 4],
            "x": [2, 5],
            "tensor": tensor_input(SET)["tensor"],
        },
        {"conv2": region([2, 7], (1, 4), (2, 5), SET.expand_as)},
    ),
]


@pytest.mark.parametrize(("name", "edit", "direct"), CASES, ids=[c[0] for c in CASES])
def test_each_op_equals_a_hand_registered_hook(
    lenet_client: TestClient, lenet: LeNet, name: str, edit: dict[str, Any], direct: dict[str, Edit]
) -> None:
    x = torch.stack([digit_pixels(4), digit_pixels(9)])
    answer = post(
        lenet_client, "/interventions", inputs=[tensor_input(t) for t in x], edits=[edit], include_logits=True
    )
    torch.testing.assert_close(logits_of(answer, "clean"), edited_logits(lenet, x, {}), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits_of(answer, "edited"), edited_logits(lenet, x, direct), rtol=1e-5, atol=1e-5)
    assert answer["applied"][0]["edit"] == 0
    assert answer["applied"][0]["site"] == edit["site"]
    assert hooks(lenet_client, "lenet") == 0


def test_noise_is_seeded_and_mean_over_the_batch_uses_the_clean_inputs(lenet_client: TestClient, lenet: LeNet) -> None:
    x = torch.stack([digit_pixels(1), digit_pixels(2), digit_pixels(3)])
    inputs = [tensor_input(t) for t in x]
    noisy = [{"site": "fc1", "op": "noise", "std": 0.7, "seed": 5}]
    once = post(lenet_client, "/interventions", inputs=inputs, edits=noisy, include_logits=True)
    again = post(lenet_client, "/interventions", inputs=inputs, edits=noisy, include_logits=True)
    assert torch.equal(logits_of(once, "edited"), logits_of(again, "edited"))
    noise = 0.7 * torch.randn((3, 120), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(
        logits_of(once, "edited"), edited_logits(lenet, x, {"fc1": lambda t: t + noise}), rtol=1e-5, atol=1e-5
    )
    with torch.inference_mode():
        served: Any
        served, sx = as_served(lenet, x)
        clean_fc1 = served.fc1(
            torch.flatten(served.pool(served.relu(served.conv2(served.pool(served.relu(served.conv1(sx)))))), 1)
        )
    mean = [{"site": "fc1", "op": "mean", "over": "batch", "channels": [0, 1, 2]}]
    answer = post(lenet_client, "/interventions", inputs=inputs, edits=mean, include_logits=True)

    def batch_mean(t: Tensor) -> Tensor:
        t[:, :3] = clean_fc1[:, :3].mean(0, keepdim=True)
        return t

    torch.testing.assert_close(
        logits_of(answer, "edited"), edited_logits(lenet, x, {"fc1": batch_mean}), rtol=1e-5, atol=1e-5
    )


def test_patching_equals_running_the_donor_and_injecting_by_hand(lenet_client: TestClient, lenet: LeNet) -> None:
    base, donor = digit_pixels(7)[None], digit_pixels(3)[None]
    served: Any
    served, sd = as_served(lenet, donor)
    captured: list[Tensor] = []
    handle = served.conv2.register_forward_hook(lambda m, a, out: captured.append(out.detach().clone()))
    with torch.inference_mode():
        served(sd)
    handle.remove()
    edits = [{"site": "conv2", "op": "patch", "source": "three", "channels": [0, 1, 2, 3]}]
    answer = post(
        lenet_client,
        "/interventions",
        inputs=[tensor_input(base[0])],
        sources={"three": [tensor_input(donor[0])]},
        edits=edits,
        include_logits=True,
        layers=["fc3"],
    )

    def patch(t: Tensor) -> Tensor:
        t[:, :4] = captured[0][:, :4]
        return t

    want = edited_logits(lenet, base, {"conv2": patch})
    torch.testing.assert_close(logits_of(answer, "edited"), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(as_tensor(answer["activations"]["fc3"]["output"]), want, rtol=1e-5, atol=1e-5)
    change = answer["change"][0]
    assert change["target"] == 7  # the clean top-1
    assert change["delta"] == pytest.approx(change["edited_score"] - change["clean_score"])
    assert change["kl_divergence"] > 0


def test_a_sweep_equals_ablating_one_channel_at_a_time(lenet_client: TestClient, lenet: LeNet) -> None:
    x = digit_pixels(5)[None]
    answer = post(
        lenet_client, "/interventions/sweep", inputs=[tensor_input(x[0])], site="conv2", channels=[2, 12], target=5
    )
    clean = float(edited_logits(lenet, x, {})[0, 5])
    assert answer["clean_scores"] == pytest.approx([clean], rel=1e-5)
    want = {c: float(edited_logits(lenet, x, {"conv2": zeroed([c])})[0, 5]) - clean for c in range(2, 12)}
    got = {e["channel"]: e["delta"] for e in answer["channels"]}
    assert got == pytest.approx(want, abs=1e-4)
    deltas = [e["delta"] for e in answer["channels"]]
    assert deltas == sorted(deltas)  # the most needed channel first
    assert hooks(lenet_client, "lenet") == 0


def test_a_sweep_over_several_inputs_ablates_the_channel_in_every_input(lenet_client: TestClient, lenet: LeNet) -> None:
    """Each input's delta is its own target score with the channel zeroed in its own forward rows, for every input
    of the request (the ablated copies of the inputs share one forward)."""
    x = torch.stack([digit_pixels(5), digit_pixels(8)])
    targets = [5, 8]
    answer = post(
        lenet_client,
        "/interventions/sweep",
        inputs=[tensor_input(t) for t in x],
        site="conv2",
        channels=[2, 6],
        target=targets,
    )
    rows = torch.arange(2)
    clean = edited_logits(lenet, x, {})[rows, targets]
    assert answer["clean_scores"] == pytest.approx(clean.tolist(), rel=1e-5)
    want = {c: (edited_logits(lenet, x, {"conv2": zeroed([c])})[rows, targets] - clean).tolist() for c in range(2, 6)}
    assert any(abs(deltas[1]) > 1e-2 for deltas in want.values())  # the second input's score does move
    got = {e["channel"]: e["deltas"] for e in answer["channels"]}
    assert got.keys() == want.keys()
    for channel, deltas in want.items():
        assert got[channel] == pytest.approx(deltas, abs=1e-4), channel


def test_patching_several_inputs_takes_each_inputs_own_donor_row(lenet_client: TestClient, lenet: LeNet) -> None:
    """A source of one donor per input: input i gets donor i's values at the site, not the first donor's."""
    base = torch.stack([digit_pixels(7), digit_pixels(1)])
    donors = torch.stack([digit_pixels(3), digit_pixels(6)])
    served: Any
    served, sd = as_served(lenet, donors)
    captured: list[Tensor] = []
    handle = served.conv2.register_forward_hook(lambda m, a, out: captured.append(out.detach().clone()))
    with torch.inference_mode():
        served(sd)
    handle.remove()
    assert not torch.allclose(captured[0][0, 4:8], captured[0][1, 4:8])  # the donors differ where patched
    answer = post(
        lenet_client,
        "/interventions",
        inputs=[tensor_input(t) for t in base],
        sources={"donors": [tensor_input(t) for t in donors]},
        edits=[{"site": "conv2", "op": "patch", "source": "donors", "channels": [4, 5, 6, 7]}],
        include_logits=True,
    )

    def patch(t: Tensor) -> Tensor:
        t[:, 4:8] = captured[0][:, 4:8]
        return t

    want = edited_logits(lenet, base, {"conv2": patch})
    torch.testing.assert_close(logits_of(answer, "edited"), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"edits": [{"site": "conv9", "op": "zero"}]}, 422, "'conv2'"),
        ({"edits": [{"site": "conv2", "op": "zero", "channels": [16]}]}, 422, "out of range"),
        ({"edits": [{"site": "relu", "call": 5, "op": "zero"}]}, 422, "runs 4 time(s)"),
        ({"edits": [{"site": "conv2", "op": "set", "tensor": {"shape": [3], "data": [1, 2, 3]}}]}, 422, "selection is"),
        ({"edits": [{"site": "conv2", "op": "patch", "source": "nope"}]}, 422, "no source named 'nope'"),
        (
            {
                "edits": [{"site": "conv2", "op": "zero"}],
                "sources": {"s": [tensor_input(SET.new_zeros(3, 32, 32))] * 3},
            },
            422,
            "give 1",
        ),
        ({"edits": [{"site": "conv2", "op": "zero", "y": [0, 99]}]}, 422, "y [0, 99] is out of range"),
        ({"edits": [{"site": "fc1", "op": "mean"}]}, 422, "no spatial dims"),
        ({"edits": [{"site": "fc1", "op": "zero"}] * 5}, 413, "max_edits"),
        ({"edits": [{"site": "conv2", "op": "exec", "code": "print(1)"}]}, 422, "op"),
    ],
)
def test_invalid_edits_are_refused_and_leave_no_hooks(
    lenet_client: TestClient, body: dict[str, Any], status: int, needle: str
) -> None:
    inputs = [tensor_input(digit_pixels(0)), tensor_input(digit_pixels(1))]
    response = lenet_client.post("/interventions", json={"model": "lenet", "inputs": inputs, **body})
    assert response.status_code == status, response.text
    assert needle in str(response.json()["detail"])
    assert hooks(lenet_client, "lenet") == 0


def test_an_edit_that_never_fires_is_a_422(lenet_client: TestClient) -> None:
    bright = torch.full((3, 8, 8), 50.0)  # its mean is over 10: `maybe` does not run
    body = {"model": "branchy", "inputs": [tensor_input(bright)], "edits": [{"site": "maybe", "op": "zero"}]}
    response = lenet_client.post("/interventions", json=body)
    assert response.status_code == 422
    assert "never fired: 'maybe' ran 0 time(s) in the forward" in response.json()["detail"]
    assert hooks(lenet_client, "branchy") == 0
    dim = torch.zeros(3, 8, 8)
    assert lenet_client.post("/interventions", json={**body, "inputs": [tensor_input(dim)]}).status_code == 200


def test_a_sweep_over_its_limit_is_a_413(lenet_client: TestClient) -> None:
    response = lenet_client.post(
        "/interventions/sweep", json={"model": "lenet", "inputs": [tensor_input(digit_pixels(0))], "site": "conv2"}
    )
    assert response.status_code == 413
    assert "max_sweep_rows" in response.json()["detail"]


def test_concurrent_interventions_never_touch_concurrent_predictions(lenet_client: TestClient, lenet: LeNet) -> None:
    app = lenet_client.app
    xs = [digit_pixels(d)[None] for d in range(10)]

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://hookserve", timeout=60) as client:
            calls = []
            for i, x in enumerate(xs):
                body: dict[str, Any] = {"model": "lenet", "inputs": [tensor_input(x[0])], "include_logits": True}
                if i % 2:
                    calls.append(client.post("/predict", json=body))
                else:
                    edits = [{"site": "conv1", "op": "zero"}, {"site": "fc2", "op": "scale", "factor": 3.0}]
                    calls.append(client.post("/interventions", json={**body, "edits": edits}))
            return list(await asyncio.gather(*calls))

    responses = asyncio.run(scenario())
    for i, (x, response) in enumerate(zip(xs, responses, strict=True)):
        assert response.status_code == 200, response.text
        if i % 2:
            got = torch.tensor(response.json()["predictions"][0]["logits"])
            torch.testing.assert_close(got, edited_logits(lenet, x, {})[0], rtol=1e-5, atol=1e-5)
        else:
            edited = {"conv1": lambda t: t * 0, "fc2": lambda t: t * 3.0}
            torch.testing.assert_close(
                logits_of(response.json(), "edited"), edited_logits(lenet, x, edited), rtol=1e-5, atol=1e-5
            )
    assert hooks(lenet_client, "lenet") == 0


def test_numbers_that_are_not_finite_are_refused(lenet_client: TestClient) -> None:
    """1e400 is no JSON number the parser accepts (400); NaN in a base64 tensor is the edit's 422."""
    inputs = json.dumps([tensor_input(digit_pixels(0))])
    raw = f'{{"model": "lenet", "inputs": {inputs}, "edits": [{{"site": "conv2", "op": "scale", "factor": 1e400}}]}}'
    response = lenet_client.post("/interventions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    nan = tensor_input(torch.full((16,), float("nan")), as_b64=True)["tensor"]
    body = {"model": "lenet", "inputs": json.loads(inputs), "edits": [{"site": "conv2", "op": "add", "tensor": nan}]}
    response = lenet_client.post("/interventions", json=body)
    assert response.status_code == 422
    assert "NaN or infinite" in response.json()["detail"]
    assert hooks(lenet_client, "lenet") == 0


R18_TOML = """
[[models]]
name = "r18"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
"""


@pytest.fixture
def r18_client(make_client: ClientFactory, tmp_path: Path, r18: nn.Module) -> TestClient:
    torch.save(r18.state_dict(), tmp_path / "r18.pt")
    return make_client(R18_TOML)


def edited_graph(model: nn.Module, x: Tensor, edits: dict[str, Edit]) -> Tensor:
    """The model traced by FX, each named node's value passed through its edit, run on `x` (as served)."""
    served, sx = as_served(model, x)
    graph = torch.fx.symbolic_trace(served)
    for node in list(graph.graph.nodes):
        edit = edits.get(node.name)
        if edit is None:
            continue
        with graph.graph.inserting_after(node):
            changed = graph.graph.call_function(edit, (node,))
        node.replace_all_uses_with(changed, delete_user_cb=lambda user, c=changed: user is not c)
    graph.recompile()
    with torch.inference_mode():
        logits: Tensor = graph(sx).float()
        return logits


def test_edits_at_functional_nodes_equal_editing_the_graph_by_hand(r18_client: TestClient, r18: nn.Module) -> None:
    """resnet18's residual `+` of a block is a node, no module: zero some of its channels, scale another."""
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    edits = [
        {"node": "layer1.0.add", "op": "zero", "channels": [0, 1, 2]},
        {"node": "layer2.1.add", "op": "scale", "factor": 0.5},
    ]
    body = {"model": "r18", "inputs": [tensor_input(x[0])], "edits": edits, "include_logits": True}
    answer = r18_client.post("/interventions", json=body | {"nodes": ["layer4.1.add"]})
    assert answer.status_code == 200, answer.text
    # plain FX names the residual adds add, add_1, ... in graph order: layer1.0 has the first, layer2.1 the fourth
    want = edited_graph(r18, x, {"add": zeroed([0, 1, 2]), "add_3": lambda t: t * 0.5})
    torch.testing.assert_close(logits_of(answer.json(), "edited"), want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits_of(answer.json(), "clean"), want, atol=1e-3)  # the edits did change it
    assert [a["site"] for a in answer.json()["applied"]] == ["layer1.0.add", "layer2.1.add"]
    assert answer.json()["activations"]["layer4.1.add"]["output"]["shape"] == [1, 512, 2, 2]
    assert hooks(r18_client, "r18") == 0


def test_patching_a_node_equals_injecting_the_donors_value(r18_client: TestClient, r18: nn.Module) -> None:
    from torchvision.models.feature_extraction import create_feature_extractor

    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    donor = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    served, sd = as_served(r18, donor)
    with torch.inference_mode():
        value = create_feature_extractor(served, ["layer1.0.relu_1"])(sd)["layer1.0.relu_1"].clone()
    body = {
        "model": "r18",
        "inputs": [tensor_input(x[0])],
        "sources": {"d": [tensor_input(donor[0])]},
        "edits": [{"node": "layer1.0.relu_1", "op": "patch", "source": "d"}],
        "include_logits": True,
    }
    answer = r18_client.post("/interventions", json=body)
    assert answer.status_code == 200, answer.text
    want = edited_graph(r18, x, {"layer1_0_relu_1": lambda t: value.to(t.dtype).clone()})
    torch.testing.assert_close(logits_of(answer.json(), "edited"), want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits_of(answer.json(), "clean"), want, atol=1e-3)  # the patch did change it


def test_node_and_module_edits_do_not_mix_and_unknown_nodes_name_the_closest(r18_client: TestClient) -> None:
    x = [tensor_input(torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(3)))]
    mixed = [{"node": "layer1.0.add", "op": "zero"}, {"site": "conv1", "op": "zero"}]
    refused = r18_client.post("/interventions", json={"model": "r18", "inputs": x, "edits": mixed})
    assert refused.status_code == 422
    assert "either all at modules" in refused.json()["detail"]
    unknown = [{"node": "layer1.0.ad", "op": "zero"}]
    refused = r18_client.post("/interventions", json={"model": "r18", "inputs": x, "edits": unknown})
    assert refused.status_code == 422
    assert "'layer1.0.add'" in refused.json()["detail"]
    assert hooks(r18_client, "r18") == 0


SIZES_PY = '''
import torch
from torch import nn


class Sizes(nn.Module):
    """conv -> mean -> fc; records the batch size of every forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)
        self.sizes = []

    def forward(self, x):
        self.sizes.append(int(x.shape[0]))
        return self.fc(self.conv(x).mean((2, 3)))
'''

SIZES_TOML = """
[[models]]
name = "sizes"
source = "python"
architecture = "sizes.py:Sizes"
input_size = [3, 8, 8]
"""


def test_a_sweep_over_more_inputs_than_rows_per_forward_ablates_one_channel_per_forward(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    """rows_per_forward is 4 x max_batch_size = 4 here; 5 inputs exceed it, so each ablated forward takes one channel's
    copy of the inputs (5 rows), never two channels' (10 rows)."""
    (tmp_path / "sizes.py").write_text(SIZES_PY)
    client = make_client(SIZES_TOML, max_batch_size=1, max_sweep_rows=100)
    copies = client.app.state.hookserve.fleet.ready("sizes").model.hookable_modules  # type: ignore[attr-defined]
    for lane in copies:
        lane.sizes.clear()
    inputs = [tensor_input(torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(i))) for i in range(5)]
    answer = post(client, "/interventions/sweep", model="sizes", inputs=inputs, site="conv", channels=[0, 3], target=0)
    assert sorted(e["channel"] for e in answer["channels"]) == [0, 1, 2]
    assert [size for lane in copies for size in lane.sizes] == [5, 5, 5, 5]  # the clean forward, one per channel


def test_a_patch_from_a_source_that_never_reached_its_site_is_a_422_naming_both(lenet_client: TestClient) -> None:
    """branchy's `maybe` runs only on dim inputs: patching it from a bright source has nothing to take there."""
    body = {
        "model": "branchy",
        "inputs": [tensor_input(torch.zeros(3, 8, 8))],
        "sources": {"bright": [tensor_input(torch.full((3, 8, 8), 50.0))]},
        "edits": [{"site": "maybe", "op": "patch", "source": "bright"}],
    }
    response = lenet_client.post("/interventions", json=body)
    assert response.status_code == 422, response.text
    assert "source 'bright' never reached 'maybe', so it has nothing to give there" in response.json()["detail"]
    assert hooks(lenet_client, "branchy") == 0
