"""Action statistics: Cosmos 3 formulas, round trips, and stats-file errors that name the file and the key."""

from __future__ import annotations

import json

import pytest
import torch

from trajectory_ensemble_node.errors import StatsFileError
from trajectory_ensemble_node.normalization import (
    NORMALIZATION_METHODS,
    STAT_KEYS,
    ActionNormalizer,
)

WIDTH = 4
STATS = {
    "q01": [-1.0, 0.0, 10.0, -0.5],
    "q99": [1.0, 2.0, 14.0, 0.5],
    "mean": [0.0, 1.0, 12.0, 0.1],
    "std": [0.5, 2.0, 1.0, 0.2],
    "min": [-2.0, -1.0, 9.0, -1.0],
    "max": [2.0, 3.0, 15.0, 1.0],
}


def write(tmp_path, data, name="stats.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_quantile_formula_and_clamp():
    norm = ActionNormalizer.from_dict(STATS, "quantile", WIDTH)
    raw = torch.tensor([[0.0, 1.5, 11.0, 0.25], [5.0, -3.0, 14.0, -0.5]])
    expected = torch.tensor([[0.0, 0.5, -0.5, 0.5], [1.0, -1.0, 1.0, -1.0]])
    torch.testing.assert_close(norm.normalize(raw), expected)
    # The inverse is affine and does not clamp: the round trip is exact only inside [q01, q99].
    torch.testing.assert_close(norm.denormalize(expected[:1]), raw[:1])
    torch.testing.assert_close(norm.denormalize(torch.full((1, WIDTH), 1.0)), torch.tensor([STATS["q99"]]))
    assert norm.denormalize(torch.full((1, WIDTH), 1.5))[0, 0].item() == pytest.approx(1.5)


@pytest.mark.parametrize("method", NORMALIZATION_METHODS)
def test_round_trip(method):
    norm = ActionNormalizer.from_dict(STATS, method, WIDTH)
    low, high = torch.tensor(STATS["q01"]), torch.tensor(STATS["q99"])
    unit = torch.rand(3, 16, WIDTH, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    raw = low + unit * (high - low)  # inside [q01, q99], where quantile's clamp is inactive
    torch.testing.assert_close(norm.denormalize(norm.normalize(raw)), raw)
    assert norm.normalize(raw).dtype == torch.float64
    assert norm.width == WIDTH and norm.method == method


def test_meanstd_and_minmax_formulas():
    raw = torch.tensor([[1.0, 3.0, 12.0, 0.3]])
    meanstd = ActionNormalizer.from_dict(STATS, "meanstd", WIDTH)
    torch.testing.assert_close(meanstd.normalize(raw), torch.tensor([[2.0, 1.0, 0.0, 1.0]]))
    minmax = ActionNormalizer.from_dict(STATS, "minmax", WIDTH)
    torch.testing.assert_close(minmax.normalize(raw), torch.tensor([[0.5, 1.0, 0.0, 0.3]]))


def test_tiny_range_is_guarded_by_eps():
    norm = ActionNormalizer.from_dict({"q01": [0.0], "q99": [1e-12]}, "quantile", 1)
    assert torch.isfinite(norm.normalize(torch.tensor([[0.5]]))).all()


def test_width_mismatch_quotes_shapes():
    norm = ActionNormalizer.from_dict(STATS, "quantile", WIDTH)
    with pytest.raises(ValueError, match=r"\[\.\.\., 4\].*\(2, 64\)"):
        norm.normalize(torch.zeros(2, 64))
    with pytest.raises(ValueError, match=r"\(3,\)"):
        norm.denormalize(torch.zeros(3))


@pytest.mark.parametrize(
    ("data", "domain"),
    [
        (STATS, None),
        ({"action": STATS, "state": {"q01": [0.0], "q99": [1.0]}}, None),
        ({"droid_lerobot": STATS, "bridge_orig_lerobot": {}}, "droid_lerobot"),
        ({"droid_lerobot": {"action": STATS}}, "droid_lerobot"),
    ],
)
def test_json_shapes(tmp_path, data, domain):
    path = write(tmp_path, data)
    norm = ActionNormalizer.from_json(path, "quantile", WIDTH, domain=domain)
    torch.testing.assert_close(norm.stats["q99"], torch.tensor(STATS["q99"], dtype=torch.float64))
    assert set(norm.stats) == set(STAT_KEYS["quantile"])
    assert norm.source == str(path)


def stats_without(key, **replace):
    data = {k: v for k, v in STATS.items() if k != key}
    data.update(replace)
    return data


@pytest.mark.parametrize(
    ("data", "method", "domain", "needles"),
    [
        ("{not json", "quantile", None, ["not valid JSON"]),
        ([1, 2], "quantile", None, ["JSON object"]),
        (stats_without("q99"), "quantile", None, ["'q99'", "missing"]),
        (stats_without("std"), "meanstd", None, ["'std'"]),
        ({"action": stats_without("max")}, "minmax", None, ["'action.max'"]),
        ({"droid_lerobot": STATS}, "quantile", "bridge", ["'bridge'", "droid_lerobot"]),
        ({"droid_lerobot": [1]}, "quantile", "droid_lerobot", ["'droid_lerobot'", "object"]),
        ({"droid_lerobot": stats_without("q01")}, "quantile", "droid_lerobot", ["'droid_lerobot.q01'"]),
        (stats_without("q01", q01=[0.0, "a", 1.0, 2.0]), "quantile", None, ["'q01'", "channel 1", "'a'"]),
        (stats_without("q01", q01="0 1 2 3"), "quantile", None, ["'q01'", "list of numbers"]),
        (stats_without("q01", q01=[]), "quantile", None, ["'q01'"]),
        (stats_without("q01", q01=[0.0, 1.0, 2.0]), "quantile", None, ["'q01'", "3 channels", "width is 4"]),
        (stats_without("mean", mean=[0.0] * 10), "meanstd", None, ["'mean'", "10 channels"]),
        ('{"q01": [0, NaN, 0, 0], "q99": [1, 1, 1, 1]}', "quantile", None, ["'q01'", "non-finite", "[1]"]),
        (stats_without("q99", q99=[1.0, 0.0, 14.0, -1.0]), "quantile", None, ["'q99'", "q99 > q01", "[1, 3]"]),
        (stats_without("std", std=[0.5, 0.0, 1.0, 0.2]), "meanstd", None, ["'std'", "std > 0", "[1]"]),
        (stats_without("max", max=[2.0, 3.0, 9.0, 1.0]), "minmax", None, ["'max'", "max > min", "[2]"]),
    ],
)
def test_stats_file_errors_name_file_and_key(tmp_path, data, method, domain, needles):
    path = write(tmp_path, data)
    with pytest.raises(StatsFileError) as info:
        ActionNormalizer.from_json(path, method, WIDTH, domain=domain)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "nowhere" / "stats.json"
    with pytest.raises(StatsFileError, match="not found") as info:
        ActionNormalizer.from_json(path, "quantile", WIDTH)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(("method", "width"), [("zscore", WIDTH), ("quantile", 0), ("quantile", True)])
def test_bad_method_or_width(method, width):
    with pytest.raises(StatsFileError, match=repr(method) if method == "zscore" else "width"):
        ActionNormalizer.from_dict(STATS, method, width)


def test_from_dict_accepts_tensors():
    norm = ActionNormalizer.from_dict({"q01": torch.zeros(2), "q99": torch.ones(2)}, "quantile", 2)
    torch.testing.assert_close(norm.normalize(torch.tensor([0.5, 1.0])), torch.tensor([0.0, 1.0]))
