"""Typed reports (issue 46): no module reads a metric by its key but the one that defines it, no number travels
through a string split or join inside the package, and every report survives ``as_metrics`` -> ``from_metrics``."""

from __future__ import annotations

import ast
import math
import pickle
import re
from pathlib import Path

import pytest
import torch

from trajectory_ensemble_node.contract import CandidateGroup, CandidateTrajectorySpec, EnsembleResult, MetricsView
from trajectory_ensemble_node.engine.context import ContinuityReport
from trajectory_ensemble_node.engine.deadline import StepsReport
from trajectory_ensemble_node.engine.validity import ValidityCounts
from trajectory_ensemble_node.metrics import (
    GROUP_METRIC_KEYS,
    AdapterExtras,
    GroupCounters,
    numbers_as_sent,
    numbers_text,
    wire_metrics,
)
from trajectory_ensemble_node.novelty import NoveltyReport
from trajectory_ensemble_node.safety import REASONS
from trajectory_ensemble_node.uncertainty import UncertaintyReport, estimate_uncertainty

PACKAGE = Path(__file__).resolve().parents[1] / "trajectory_ensemble_node"
# The modules that define reports: only they read a metric by its key.
DEFINING = {"metrics.py", "uncertainty.py", "novelty.py", "engine/deadline.py", "engine/validity.py",
            "engine/context.py"}
# The one place numbers become a comma list (a wire text field).
NUMBERS_TEXT = ("metrics.py", "numbers_text")
# Terminal lines for an operator (a trajectory's rows, an evaluation summary): numbers shown, never parsed back.
DISPLAY_FILES = {"send_goal.py", "demo.py"}
_NUMERIC_SPEC = re.compile(r"^[-+ #0-9,._<>=^]*[gfeEdn%]$")


def _is_metrics(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "metrics" in name


def _is_key(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(node, ast.JoinedStr)


def _mentions_metrics(node: ast.AST) -> bool:
    return any(_is_metrics(n) or (isinstance(n, ast.Constant) and isinstance(n.value, str)
                                  and n.value.startswith(("uncertainty_", "novelty_")))
               for n in ast.walk(node))


def _numeric_fstring(node: ast.AST) -> bool:
    if not isinstance(node, ast.JoinedStr):
        return False
    for value in node.values:
        if isinstance(value, ast.FormattedValue) and isinstance(value.format_spec, ast.JoinedStr):
            spec = "".join(c.value for c in value.format_spec.values if isinstance(c, ast.Constant))
            if _NUMERIC_SPEC.match(spec):
                return True
    return False


def _functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node -> the name of the function it is in ("" at module level)."""
    owner: dict[ast.AST, str] = {}
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                owner.setdefault(node, func.name)
    return owner


def violations(source: str, relative: str) -> list[str]:
    """What one module does against the rules: key reads of a metrics mapping outside the defining modules, a split
    of a metrics value, and a join of numbers outside :func:`numbers_text` and operator display."""
    tree = ast.parse(source)
    owner = _functions(tree)
    found = []
    defining = relative in DEFINING
    for node in ast.walk(tree):
        where = f"{relative}:{getattr(node, 'lineno', '?')}"
        if (not defining and isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and _is_metrics(node.value) and _is_key(node.slice)):
            found.append(f"{where}: key read {ast.unparse(node)}")
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method, receiver = node.func.attr, node.func.value
        if not defining and method == "get" and _is_metrics(receiver) and node.args and _is_key(node.args[0]):
            found.append(f"{where}: key read {ast.unparse(node)}")
        if method in ("split", "rsplit") and _mentions_metrics(receiver):
            found.append(f"{where}: split of a metrics value {ast.unparse(node)}")
        if method == "join" and node.args and isinstance(node.args[0], (ast.GeneratorExp, ast.ListComp)):
            element = node.args[0].elt
            numbers = _numeric_fstring(element) or _mentions_metrics(node.args[0])
            allowed = ((relative.rsplit("/", 1)[-1], owner.get(node, "")) == NUMBERS_TEXT
                       or relative.rsplit("/", 1)[-1] in DISPLAY_FILES)
            if numbers and not allowed:
                found.append(f"{where}: join of numbers {ast.unparse(node)}")
    return found


def test_no_metric_is_read_by_key_and_no_number_is_split_or_joined_outside_its_report():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += violations(path.read_text(encoding="utf-8"), path.relative_to(PACKAGE).as_posix())
    assert found == []


def test_the_scan_finds_planted_violations():
    planted = '''
def f(result, metrics, values):
    a = result.metrics["total_ms"]
    b = metrics.get("uncertain", False)
    c = metrics.get(f"dropped_{reason}")
    d = [float(v) for v in str(metrics.get("uncertainty_step_std")).split(",")]
    e = ",".join(f"{v:.4g}" for v in values)
    metrics["goal_ms"] = 1.0
    return ", ".join(str(name) for name in values)
'''
    found = violations(planted, "ros/planted.py")
    assert len(found) == 6, found  # two reads on line 6 (get, then split); the store and the names are fine
    assert [line.split(":")[1] for line in found].count("6") == 2
    # The defining module may read its keys, and numbers_text may join; no split of a metrics value anywhere.
    assert violations(planted, "uncertainty.py") == [f for f in violations(planted, "uncertainty.py")
                                                     if "split" in f or "join" in f]
    assert len(violations(planted, "uncertainty.py")) == 2
    join = 'def numbers_text(values):\n    return ",".join(f"{v:.4g}" for v in values)\n'
    assert violations(join, "metrics.py") == [] and len(violations(join, "ros/results.py")) == 1


FULL_UNCERTAINTY = UncertaintyReport(
    modes=2, mode_share=0.75, spread=0.5, step_std=(0.1, 0.25, 1.5), step_std_max=1.5, score=0.3, rule="both",
    uncertain=True, threshold=0.2, novelty=NoveltyReport(2.5, None, 1.0, True, 2.0), window=3, score_window=0.4)

REPORTS = [
    GroupCounters(**{key: i for i, key in enumerate(GROUP_METRIC_KEYS)}),
    GroupCounters(candidate_count=4, fallback_reason=None, total_ms=12.5),
    StepsReport(10, 4, 3, 250.0, False),
    StepsReport(10, 10, 10),
    ValidityCounts(6, 2, 1, tuple(range(len(REASONS))), True),
    ValidityCounts(4, 0, 0, (0,) * len(REASONS)),
    ContinuityReport(2, 4, 4.0, 12, "prefix", 0.25),
    ContinuityReport(),
    FULL_UNCERTAINTY,
    UncertaintyReport(modes=1, mode_share=1.0, spread=0.0, step_std=(0.0, 0.0), step_std_max=0.0, score=0.0),
    UncertaintyReport(modes=1, mode_share=1.0, spread=0.0, step_std=(), step_std_max=0.0, score=0.0,
                      threshold=0.1, uncertain=False),
    UncertaintyReport(modes=3, mode_share=0.5, spread=1.0, step_std=(0.5,), step_std_max=0.5, score=0.9,
                      rule="novelty", uncertain=True,
                      novelty=NoveltyReport(math.inf, "novelty score inf is not finite", 1.0, True)),
    NoveltyReport(0.5, None, 1.0, False),
]


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: type(r).__name__)
def test_every_report_survives_as_metrics_then_from_metrics(report):
    flat = report.as_metrics()
    assert type(report).from_metrics(flat) == report
    # What a wire carries: scalars, None and text only.
    assert all(isinstance(v, (bool, int, float, str)) or v is None for v in wire_metrics(flat).values())


def test_reports_read_back_from_a_mapping_that_holds_others_and_the_node_entries():
    flat = {"goal_ms": 3.0, "continuity": "continued"}
    one_of_each = [REPORTS[0], REPORTS[2], REPORTS[4], REPORTS[6], FULL_UNCERTAINTY]
    for report in one_of_each:
        flat.update(report.as_metrics())
    for report in one_of_each:
        assert type(report).from_metrics(flat) == report
    assert NoveltyReport.from_metrics({"uncertainty_score": 0.1}) is None
    assert UncertaintyReport.from_metrics({}) == UncertaintyReport()


def test_uncertainty_entries_keep_the_order_results_carried():
    assert list(FULL_UNCERTAINTY.as_metrics()) == [
        "uncertainty_modes", "uncertainty_mode_share", "uncertainty_spread", "uncertainty_step_std",
        "uncertainty_step_std_max", "uncertainty_score", "uncertainty_rule", "uncertain", "uncertainty_threshold",
        "novelty_score", "novelty_threshold", "novel", "novelty_score_window", "uncertainty_window",
        "uncertainty_score_window"]
    spread_only = estimate_uncertainty(torch.randn(5, 4, 2, generator=torch.Generator().manual_seed(0)))
    assert list(spread_only.report(0.1).as_metrics())[-2:] == ["uncertainty_threshold", "uncertain"]


def test_step_std_is_numbers_in_process_and_text_only_on_the_wire():
    values = (0.123456, 1.0, 12345.678, 9.99996e-5, 0.0)
    report = UncertaintyReport(step_std=values, step_std_max=max(values), score=0.1)
    assert report.as_metrics()["uncertainty_step_std"] == values
    text = wire_metrics(report.as_metrics())["uncertainty_step_std"]
    assert text == numbers_text(values) == ",".join(f"{v:.4g}" for v in values)
    # The typed message field carries the same values the text does.
    assert numbers_as_sent(values) == tuple(float(f"{v:.4g}") for v in values)


def test_a_result_flattens_its_reports_in_order_and_its_metrics_are_read_only():
    spec = CandidateTrajectorySpec(count=2, reducer="mean")
    group = CandidateGroup.for_spec("r", spec)
    counters = GroupCounters(candidate_count=2, total_ms=5.0)
    extras = AdapterExtras((("total_ms", -1.0), ("adapter_note", "x")))
    result = EnsembleResult(group, spec, torch.zeros(3, 2), (0, 1), (7, 8),
                            reports=(counters, StepsReport(3, 3, 3), extras, FULL_UNCERTAINTY),
                            metrics={"given": 1})
    expected = {**counters.as_metrics(), **StepsReport(3, 3, 3).as_metrics(), "adapter_note": "x",
                **FULL_UNCERTAINTY.as_metrics(), "given": 1}
    assert list(result.metrics.items()) == list(expected.items())  # extras never replace an engine entry
    assert result.report(UncertaintyReport) is FULL_UNCERTAINTY and result.report(ContinuityReport) is None
    assert isinstance(result.metrics, MetricsView)
    with pytest.raises(TypeError, match="read-only"):
        result.metrics["total_ms"] = 0.0  # type: ignore[index]
    assert pickle.loads(pickle.dumps(result.metrics)) == result.metrics
    copy = dict(result.metrics)
    copy["goal_ms"] = 1.0
    assert "goal_ms" not in result.metrics


def test_an_engine_result_carries_its_reports_and_its_metrics_are_their_flat_view():
    import numpy as np
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, build_pipeline

    model = Cosmos3ActionModel(build_pipeline("tiny"), uncertainty_threshold=0.05)
    result = model.generate(
        prompt="x", action=CosmosActionCondition(mode="policy", chunk_size=4, domain_name="droid_lerobot",
                                                 resolution_tier=256, image=np.zeros((64, 64, 3), np.uint8)),
        num_inference_steps=2, guidance_scale=1.0, fps=15, spec=CandidateTrajectorySpec(count=3, reducer="mode"),
        base_seed=7)
    kinds = [GroupCounters, StepsReport, ValidityCounts, UncertaintyReport]
    for kind in kinds:
        assert result.report(kind) == kind.from_metrics(result.metrics)
    assert result.report(ContinuityReport) is None and not ContinuityReport.from_metrics(result.metrics).continued
    assert list(result.metrics)[:len(GROUP_METRIC_KEYS)] == list(GROUP_METRIC_KEYS)
    step_std = result.report(UncertaintyReport).step_std
    assert isinstance(step_std, tuple) and len(step_std) == 4 and all(isinstance(v, float) for v in step_std)
