"""The real template.yaml, loaded once, and a model of it with its parameter defaults."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent_jobs_local.template import TemplateModel, load_template


@pytest.fixture(scope="session")
def loaded_template() -> dict[str, Any]:
    return load_template()


@pytest.fixture
def template(loaded_template: dict[str, Any]) -> dict[str, Any]:
    """A private copy: a test may mutate it."""
    return copy.deepcopy(loaded_template)


@pytest.fixture
def model(template: dict[str, Any]) -> TemplateModel:
    return TemplateModel(template, stack_name="agent-jobs-test")
