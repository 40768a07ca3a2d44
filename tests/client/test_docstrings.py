"""The examples in the client's docstrings run (those that need a server are marked to skip)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import service.client

MODULES = sorted(name for _, name, _ in pkgutil.walk_packages(service.client.__path__, prefix="service.client."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_retry_policy_example_is_among_them() -> None:
    import service.client.retry

    assert doctest.testmod(service.client.retry).attempted >= 4
