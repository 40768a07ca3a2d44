"""Specs written back as TOML read back equal: every replica serves exactly the models it was given."""

from __future__ import annotations

import tomllib

import pytest

from service.cluster.spec_toml import specs_toml
from service.registry.builtin import builtin_specs
from service.specs.model import ModelSpec, OptimizerSpec, PreprocessSpec, Source, parse_specs


def test_round_trip_of_every_kind_of_field() -> None:
    specs = [
        *builtin_specs(),
        ModelSpec(
            name="odd",
            source=Source.python,
            architecture='file "quoted".py:Net\\x',
            weights="w/\u00fcn\u00efcode\tname.pt",
            kwargs={"depth": 3, "scale": 1e-7, "flags": [True, False], "nested": {"a": [1, 2.5]}},
            preprocess=PreprocessSpec(crop=7, mean=[0.5], std=[0.25], grayscale=True),
            optimizer=OptimizerSpec.model_validate({"type": "Adam", "lr": 3e-4, "betas": [0.9, 0.999]}),
            max_batch_delay_ms=0.0,
            input_size=[1, 8, 8],
        ),
    ]
    again = parse_specs(tomllib.loads(specs_toml(specs)))
    assert again == specs


def test_a_null_toml_cannot_hold_is_refused() -> None:
    spec = ModelSpec(name="m", source=Source.timm, architecture="x", preprocess=PreprocessSpec(resize=None))
    with pytest.raises(ValueError, match="'m' cannot be written as TOML"):
        specs_toml([spec])
