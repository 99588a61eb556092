"""``config/serve_ray.yaml`` is a valid Serve config whose application builds (no Ray instance needed)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from trajectory_ensemble_node.errors import ParameterError
from trajectory_ensemble_node.fleet.app import parse_autoscale

schema = pytest.importorskip("ray.serve.schema")
CONFIG = Path(__file__).resolve().parents[2] / "config" / "serve_ray.yaml"


def test_the_example_config_is_a_serve_config_whose_app_builds(monkeypatch):
    config = schema.ServeDeploySchema.model_validate(yaml.safe_load(CONFIG.read_text()))
    (app,) = config.applications
    module, name = app.import_path.split(":")
    monkeypatch.chdir(CONFIG.parents[1])  # params_file is relative to where `serve run` runs
    built = getattr(importlib.import_module(module), name)(app.args)
    assert type(built).__name__ == "Application"


@pytest.mark.parametrize("text", ["3", "0,2", "3,2", "a,b", "1,2,3"])
def test_autoscale_refuses_what_is_not_min_max(text):
    with pytest.raises(ParameterError, match=repr(text)):
        parse_autoscale(text)


def test_autoscale_reads_min_max():
    assert parse_autoscale("1,4") == (1, 4) and parse_autoscale(None) is None
