"""``bench --fleet``, smoke-tested: real client processes against the real server, and the files it writes.

Speed is what the benchmark measures (bench/results/fleet-toy.md); here only that every run answers requests, that a
co-batched run shares forwards and a serial one does not, and that the JSON has the fields the issue fixes.
"""

from __future__ import annotations

import argparse
import json

import pytest

pytest.importorskip("openpi_client")

from trajectory_ensemble_lab.bench import cli

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]


def test_the_fleet_mode_is_one_entry_of_the_bench_table():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--fleet", "--clients", "1,2,4,8", "--candidates", "8", "--rate", "2", "--duration", "5"])
    assert cli.mode_name(args) == "fleet" and cli.MODES["fleet"].flags == ("--fleet",)
    assert (args.clients, args.candidates, args.rate, args.duration) == ((1, 2, 4, 8), (8,), 2.0, 5.0)


def test_a_short_fleet_run_writes_the_documented_json_markdown_and_plot(tmp_path):
    out = tmp_path / "fleet.json"
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--fleet", "--clients", "1,2", "--candidates", "1", "--duration", "1.5", "--reps", "1",
                              "--json", str(out), "--quiet"])
    assert cli.run(args) == 0
    document = json.loads(out.read_text())
    assert set(document["fleet"]) == {"1", "2"} and document["commit"] and document["date"]
    for k, modes in document["fleet"].items():
        for mode in ("cobatched", "serial"):
            figures = modes[mode]
            assert {"requests_per_s", "p50_ms", "p95_ms", "forwards_per_request"} <= set(figures), (k, mode)
            assert figures["requests"] >= 1 and figures["errors"] == 0 and figures["requests_per_s"] > 0
        assert modes["serial"]["forwards_per_request"] == pytest.approx(10.0)  # one group per forward, 10 steps
        assert modes["speedup"] > 0 and len(modes["speedup_reps"]) == 1
    assert document["fleet"]["2"]["cobatched"]["max_concurrent"] == 2
    assert document["fleet"]["2"]["serial"]["max_concurrent"] == 1
    assert "| 2 |" in out.with_suffix(".md").read_text() and out.with_suffix(".png").stat().st_size > 0
    # torch threads 1 (the bench's default) and forward_threads auto: the cores left, as serve-openpi resolves it.
    from trajectory_ensemble_node.models.cosmos3.workers import usable_cores

    assert document["threads"] == 1 and document["forward_threads"] == max(1, min(4, usable_cores()))
    assert f"forward threads {document['forward_threads']}" in out.with_suffix(".md").read_text()


def test_through_ray_is_a_flag_of_the_fleet_mode_and_openpi_stays_the_default(capsys):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert parser.parse_args(["--fleet"]).through is None  # --through is shared: each mode has its own default
    assert cli.run(parser.parse_args(["--fleet", "--through", "node"])) == 2
    assert "--fleet runs --through openpi or ray, got 'node'" in capsys.readouterr().err
    args = parser.parse_args(["--fleet", "--through", "ray", "--replicas", "1,2", "--clients", "1,8"])
    assert cli.mode_name(args) == "fleet" and (args.through, args.replicas, args.clients) == ("ray", (1, 2), (1, 8))


def test_a_short_run_through_ray_writes_serve_openpi_and_each_replica_count(tmp_path):
    pytest.importorskip("ray.serve")
    out = tmp_path / "fleet_ray.json"
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--fleet", "--through", "ray", "--replicas", "1", "--clients", "1", "--duration", "1.5",
                              "--reps", "1", "--json", str(out), "--quiet"])
    assert cli.run(args) == 0
    document = json.loads(out.read_text())
    assert document["benchmark"] == "fleet_ray" and document["commit"] and document["date"]
    assert set(document["fleet_ray"]) == {"serve-openpi", "ray-R1", "serve-openpi (after)"}
    for server, by_k in document["fleet_ray"].items():
        figures = by_k["1"]
        assert figures["requests"] >= 1 and figures["errors"] == 0 and figures["p95_ms"] > 0, server
    assert "| ray-R1 | 1 |" in out.with_suffix(".md").read_text() and out.with_suffix(".png").stat().st_size > 0
