"""``trajectory-ensemble bench --fleet --through ray``: K openpi-client processes against ``serve-ray`` with R
replicas, beside ``serve-openpi`` in the same run.

::

    trajectory-ensemble bench --fleet --through ray --replicas 1,2 --clients 1,8 --duration 10 \\
        --json bench/results/fleet_ray.json

Method. The clients are ``bench --fleet``'s (:mod:`.fleet`: unchanged ``openpi_client.WebsocketClientPolicy``
processes, one warm-up request each, then requests back to back, or at ``--rate`` Hz, for ``--duration`` seconds, each
with a new rendered toy scene; N = the first ``--candidates``). In one run, in this order: **serve-openpi** (the
toy policy's engine in this process, co-batched with ``openpi_max_concurrent = K``), then for each R in
``--replicas`` **serve-ray** (a local Ray instance with this machine's CPUs, the application ``serve-ray`` deploys:
the OpenPI ingress and R CPU engine replicas, each co-batching up to ``openpi_max_concurrent = 8`` requests), then
**serve-openpi** once more (load that drifts during the run shows as the gap between its two series), each for
every K in ``--clients``, ``--reps`` times. Reported per (server, K): answered requests per second over a run's
window (median over repetitions), p50 and p95 latency (client send to reply, pooled) and the error frames.
``--threads`` (default 1) sets this process's torch threads; Ray gives each replica one CPU and so one thread.

Outputs: ``<json>`` with ``{"fleet_ray": {"serve-openpi": {"<K>": {...}}, "ray-R1": {...}, ...}}``, ``.md`` and ``.png``
(throughput and p95 against K per server).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .fleet import SCENES_PER_CLIENT, _run_clients, summarize
from ..records import write_json

DEFAULT_JSON = Path("bench/results/fleet_ray.json")
READY = re.compile(r"ready: ws://[^:]+:(\d+)")


class _NoCounter:
    """The replicas' forwards happen in their processes: not counted here."""

    count = 0


def _images(tmp: str, clients: int) -> Path:
    import numpy as np

    from trajectory_ensemble_node.toy import heldout_scenes, render

    path = Path(tmp) / "scenes.npz"
    scenes = heldout_scenes(clients * SCENES_PER_CLIENT, seed=0)
    np.savez(path, images=np.stack([render(scene) for scene in scenes]))
    return path


def _series(port_for: Any, clients: tuple[int, ...], n: int, rate: float, duration: float, reps: int,
            images: Path, max_concurrent: Any, label: str, log: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for k in clients:
        runs = [_run_clients(port_for(k), k, n, rate, duration, images, _NoCounter()) for _ in range(reps)]
        figures = summarize(runs, max_concurrent(k))
        figures["forwards_per_request"] = None
        out[str(k)] = figures
        log(f"fleet {label} N={n} K={k}: {figures['requests_per_s']:.2f} req/s, p50 {figures['p50_ms']:.0f} ms, "
            f"p95 {figures['p95_ms']:.0f} ms, {figures['errors']} errors")
    return out


def measure(clients: tuple[int, ...], replicas: tuple[int, ...], n: int, rate: float, duration: float, reps: int,
            log: Any = print) -> dict[str, dict[str, dict[str, Any]]]:
    """serve-openpi, then serve-ray with each R, then serve-openpi again, each for every K: ``{"serve-openpi":
    {"<K>": figures}, "ray-R<R>": {...}, "serve-openpi (after)": {...}}``."""
    import ray
    from ray import serve

    from trajectory_ensemble_node.fleet.app import application
    from trajectory_ensemble_node.openpi import OpenPIPolicy, OpenPIServer, ServerLimits, ServerThread
    from trajectory_ensemble_node.serving.params import validate

    raw = {"max_candidates": max(32, n), "openpi_max_concurrent": 8, "openpi_idle_timeout_s": 0.0,
           "openpi_max_connections_per_client": 0}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        images = _images(tmp, max(clients))
        policy = OpenPIPolicy.from_params(validate(raw))
        policy.start()
        threads: list[Any] = []

        def local_port(k: int) -> int:
            limits = ServerLimits(idle_timeout_s=0.0, max_concurrent=k, max_queued=max(k, 1),
                                  max_connections=max(64, k + 1), max_connections_per_client=0)
            threads.append(ServerThread(OpenPIServer(policy, limits, port=0)).start())
            return threads[-1].port

        def local_series(label: str) -> dict[str, dict[str, Any]]:
            return _series(local_port, clients, n, rate, duration, reps, images, lambda k: k, label, log)

        try:
            results["serve-openpi"] = local_series("serve-openpi")
            ray.init(num_cpus=max(os.cpu_count() or 1, max(replicas)), include_dashboard=False, log_to_driver=False)
            try:
                serve.start(proxy_location="Disabled")
                for r in replicas:
                    ingress = serve.run(application(raw, replicas=r, port=0), name=f"bench_r{r}", route_prefix=None)
                    port = int(READY.search(ingress.ready_line.remote().result()).group(1))
                    results[f"ray-R{r}"] = _series(lambda k: port, clients, n, rate, duration, reps, images,
                                                   lambda k: 8 * r, f"serve-ray R={r}", log)
                    serve.delete(f"bench_r{r}")
            finally:
                serve.shutdown()
                ray.shutdown()
            # Once more at the end: load that drifts during the run shows as the gap between the two.
            results["serve-openpi (after)"] = local_series("serve-openpi (after)")
        finally:
            for thread in threads:
                thread.stop()
            policy.stop()
    return results


def render_markdown(document: dict[str, Any]) -> str:
    header = (f"{document['date']}, commit `{document['commit']}`, {document['machine']['cpu_model']} "
              f"({document['machine']['usable_cores']} cores), N = {document['candidates']} candidates, "
              f"{document['reps']} repetition(s) of {document['duration_s']:g} s per (server, K), rate "
              f"{document['rate_hz']:g} Hz per client (0 = back to back); load average at start "
              f"{document['load_average_start']}, end {document['load_average_end']}; the run took "
              f"{document['wall_s']:.0f} s.")
    lines = ["# Fleet: serve-openpi and serve-ray (R replicas) on the OpenPI wire (toy policy)", "", header, "",
             "| server | K clients | req/s | p50 ms | p95 ms | errors |", "|:--|--:|--:|--:|--:|--:|"]
    for server, by_k in document["fleet_ray"].items():
        for k, f in by_k.items():
            lines.append(f"| {server} | {k} | {f['requests_per_s']:.2f} | {f['p50_ms']:.0f} | {f['p95_ms']:.0f} | "
                         f"{f['errors']} |")
    lines += ["", " ".join(__doc__.split("Method. ")[1].split("\n\n")[0].split()).replace("``", "`")]
    return "\n".join(lines) + "\n"


def render_plot(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for server, by_k in document["fleet_ray"].items():
        ks = [int(k) for k in by_k]
        axes[0].plot(ks, [by_k[str(k)]["requests_per_s"] for k in ks], "o-", label=server)
        axes[1].plot(ks, [by_k[str(k)]["p95_ms"] for k in ks], "o-", label=server)
    axes[0].set(title="answered requests per second", xlabel="clients K", ylabel="req/s")
    axes[1].set(title="p95 latency", xlabel="clients K", ylabel="ms")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"serve-openpi vs serve-ray, toy policy, N={document['candidates']}, {document['date'][:10]} "
                 f"({document['commit']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Measure, then write the JSON, markdown and plot."""
    import torch

    from trajectory_ensemble_node.provenance import git_commit, utc_now

    from .report import load_average, machine_info

    torch.set_num_threads(args.threads if getattr(args, "threads", None) is not None else 1)
    if args.duration <= 0 or args.rate < 0:
        raise SystemExit(f"error: --duration must be > 0 and --rate >= 0, got {args.duration} and {args.rate}")
    out = Path(args.json or DEFAULT_JSON)
    reps = max(1, int(getattr(args, "reps", 1) or 1))
    document: dict[str, Any] = {"benchmark": "fleet_ray", "date": utc_now(), "commit": git_commit(), "model": "toy",
                                "machine": machine_info(torch.device("cpu")), "threads": torch.get_num_threads(),
                                "load_average_start": load_average(), "clients": list(args.clients),
                                "replicas": list(args.replicas), "candidates": args.candidates[0],
                                "rate_hz": args.rate, "duration_s": args.duration, "reps": reps}
    started = time.monotonic()
    quiet = getattr(args, "quiet", False)
    document["fleet_ray"] = measure(tuple(args.clients), tuple(args.replicas), args.candidates[0], args.rate,
                                    args.duration, reps,
                                    log=(lambda *_: None) if quiet else (lambda line: print(line, file=sys.stderr,
                                                                                            flush=True)))
    document.update(wall_s=time.monotonic() - started, load_average_end=load_average())
    write_json(out, document)
    out.with_suffix(".md").write_text(render_markdown(document))
    render_plot(document, out.with_suffix(".png"))
    print(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')} ({document['wall_s']:.0f} s)")
    return 0
