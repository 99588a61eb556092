"""``trajectory-ensemble bench --fleet``: K openpi-client processes against the OpenPI server, co-batched vs serial.

::

    trajectory-ensemble bench --fleet --clients 1,2,4,8 --candidates 1,8 --rate 0 --duration 20 \\
        --json bench/results/fleet-toy.json

Method. One toy policy (the bundled weights, the node's default settings) serves from this process: the real
:class:`~trajectory_ensemble_node.openpi.OpenPIServer` on a free port, its engine on its own thread, each physical
transformer forward counted by a wrapper on the adapter. For each N (``--candidates``) and K (``--clients``) two
servers run in turn on that one engine, in alternating order: **co-batched** (``openpi_max_concurrent = K``: the K
clients' groups share engine batches) and **serial** (``openpi_max_concurrent = 1``: one request at a time, what a
serializing server such as vLLM-Omni's ``max_num_seqs: 1`` deploy or cosmos_framework's lock does). K client processes,
each an unchanged ``openpi_client.WebsocketClientPolicy``, connect, send one warm-up request, and on a common start
send requests for ``--duration`` seconds: at ``--rate`` Hz each, or (``--rate 0``) the next as soon as the last reply
came. Every request carries a new rendered toy scene (clients cycle through their own held-out scenes), so no
conditioning is reused. Each (N, K) pair of runs is repeated ``--reps`` times (the bench's shared flag), the two
servers adjacent in time and their order alternating. Reported per (N, K, server): answered requests per second over
a run's window (first send to last reply; the median over the repetitions), p50 and p95 latency (client send to
reply, pooled), and physical forwards per request (pooled); the speed-up is the median of the repetitions'
co-batched/serial ratios.

``--threads`` sets ``torch.set_num_threads`` (default 1 on CPU, as the other CPU benchmarks: on a shared machine
OpenMP over every core stalls whenever another process holds one). The model's ``forward_threads`` stays ``auto``, as
``serve-openpi`` runs it: with one intra-op thread on two cores a co-batched forward's pieces use both
(``models/cosmos3/workers.py``), and a one-group forward has nothing to split. The results record both counts.

Outputs: ``<json>``, with ``{"fleet": {"<K>": {"cobatched": {...}, "serial": {...}}}}`` for the first N and
``fleet_by_candidates`` for every N; ``<json stem>.md`` (tables) and ``.png`` (throughput and p95 against K). The
client side of a run is ``python -m trajectory_ensemble_lab.bench.fleet --client ...`` (this module, light imports).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..records import write_json

DEFAULT_JSON = Path("bench/results/fleet-toy.json")
SCENES_PER_CLIENT = 16
MODES = ("cobatched", "serial")


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in str(text).split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every value must be >= 1, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--fleet`` flags (the mode flag itself is in the bench's ``MODE_FLAGS``; ``--json`` is shared)."""
    group = parser.add_argument_group("--fleet (OpenPI clients against serve-openpi)")
    group.add_argument("--clients", type=_ints, default=(1, 2, 4, 8), help="numbers of clients K (default 1,2,4,8)")
    group.add_argument("--candidates", type=_ints, default=(1,), help="candidates per request N, comma-separated "
                       "(default 1); the JSON's 'fleet' holds the first")
    group.add_argument("--rate", type=float, default=0.0,
                       help="requests per second per client; 0 = the next as soon as the reply is in (default 0)")
    group.add_argument("--duration", type=float, default=20.0, help="seconds each (N, K, server) run sends (20)")
    group.add_argument("--replicas", type=_ints, default=(1, 2), help="--through ray: engine replicas R (1,2)")


# --- the client process --------------------------------------------------------------------------------------------


def client_main(argv: list[str]) -> int:
    """One client: connect, warm up, wait for ``go`` on stdin, send for ``duration`` s, print a JSON line."""
    import numpy as np
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--images", type=Path, required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--candidates", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    args = parser.parse_args(argv)
    images = np.load(args.images)["images"]
    mine = images[args.index * SCENES_PER_CLIENT:(args.index + 1) * SCENES_PER_CLIENT]
    policy = WebsocketClientPolicy(host="127.0.0.1", port=args.port)

    def request(n: int) -> dict[str, Any]:
        return {"observation/image": mine[n % len(mine)], "num_candidates": args.candidates,
                "seed": args.index * 1_000_003 + n}

    policy.infer(request(0))  # warm-up, not counted
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    latencies, errors, sent = [], 0, 0
    while time.monotonic() - start < args.duration:
        if args.rate > 0:
            delay = start + sent / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        sent += 1
        t0 = time.monotonic()
        try:
            policy.infer(request(sent))
        except RuntimeError:
            errors += 1
            continue
        latencies.append((time.monotonic() - t0) * 1000.0)
    print(json.dumps({"latencies_ms": latencies, "errors": errors, "elapsed_s": time.monotonic() - start}),
          flush=True)
    return 0


# --- the bench process ---------------------------------------------------------------------------------------------


class ForwardCounter:
    """Counts the physical forwards the engine runs (wraps the adapter's ``forward`` on the instance)."""

    def __init__(self, adapter: Any) -> None:
        self.count = 0
        self._forward = adapter.forward
        adapter.forward = self._counted

    def _counted(self, slices: Any, should_abort: Any = None) -> int:
        forwards = self._forward(slices, should_abort)
        self.count += int(forwards)
        return forwards


def _percentile(values: list[float], q: float) -> float | None:
    import numpy as np

    return float(np.percentile(values, q)) if values else None


def _run_clients(port: int, clients: int, candidates: int, rate: float, duration: float, images: Path,
                 counter: ForwardCounter) -> dict[str, Any]:
    command = [sys.executable, "-m", "trajectory_ensemble_lab.bench.fleet", "--client", "--port", str(port),
               "--images", str(images), "--candidates", str(candidates), "--rate", str(rate),
               "--duration", str(duration)]
    procs = [subprocess.Popen([*command, "--index", str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for i in range(clients)]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a fleet client failed before starting (exit {proc.poll()})")
        forwards_before = counter.count
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = [json.loads(proc.stdout.readline()) for proc in procs]
        forwards = counter.count - forwards_before
    finally:
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    latencies = [ms for report in reports for ms in report["latencies_ms"]]
    return {"latencies_ms": latencies, "errors": sum(report["errors"] for report in reports),
            "span_s": max(report["elapsed_s"] for report in reports), "forwards": forwards}


def summarize(runs: list[dict[str, Any]], max_concurrent: int) -> dict[str, Any]:
    """One server's figures over its repetitions: the median rate, pooled latencies and forwards.

    Args:
        runs (`list[dict]`): :func:`_run_clients` of each repetition.
        max_concurrent (`int`): The server's ``openpi_max_concurrent``.
    """
    import numpy as np

    latencies = [ms for run in runs for ms in run["latencies_ms"]]
    rates = [len(run["latencies_ms"]) / run["span_s"] for run in runs if run["span_s"] > 0]
    return {
        "requests": len(latencies),
        "errors": sum(run["errors"] for run in runs),
        "reps": len(runs),
        "requests_per_s": float(np.median(rates)) if rates else 0.0,
        "requests_per_s_reps": [round(r, 3) for r in rates],
        "p50_ms": _percentile(latencies, 50),
        "p95_ms": _percentile(latencies, 95),
        "forwards_per_request": sum(run["forwards"] for run in runs) / len(latencies) if latencies else None,
        "max_concurrent": max_concurrent,
    }


def measure(clients: tuple[int, ...], candidates: tuple[int, ...], rate: float, duration: float, reps: int = 1,
            log=print, info: dict[str, Any] | None = None) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Every (N, K, server) run, ``reps`` times; ``{"<N>": {"<K>": {"cobatched": {...}, "serial": {...},
    "speedup": median of the repetitions' co-batched/serial rate ratios}}}``. ``info``, when given, receives the
    served model's ``forward_threads``."""
    import numpy as np

    from trajectory_ensemble_node.openpi import OpenPIPolicy, OpenPIServer, ServerLimits, ServerThread
    from trajectory_ensemble_node.serving.params import validate
    from trajectory_ensemble_node.toy import heldout_scenes, render

    params = validate({"max_candidates": max(32, *candidates)})
    policy = OpenPIPolicy.from_params(params)
    counter = policy.model.instrument(ForwardCounter)
    if info is not None:
        workers = policy.model.adapter.forward_workers
        info["forward_threads"] = workers.threads if workers is not None else 1
    policy.start()
    results: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        images = Path(tmp) / "scenes.npz"
        scenes = heldout_scenes(max(clients) * SCENES_PER_CLIENT, seed=0)
        np.savez(images, images=np.stack([render(scene) for scene in scenes]))
        try:
            for n in candidates:
                for k in clients:
                    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
                    for repetition in range(reps):
                        # Alternating order, each pair adjacent in time: drift in the machine's load favours neither.
                        for mode in MODES if repetition % 2 == 0 else MODES[::-1]:
                            limits = ServerLimits(idle_timeout_s=0.0, max_concurrent=k if mode == "cobatched" else 1,
                                                  max_queued=max(k, 1), max_connections=max(64, k + 1),
                                                  # K simulated robots share one host and no key: one "client".
                                                  max_connections_per_client=0)
                            thread = ServerThread(OpenPIServer(policy, limits, port=0)).start()
                            try:
                                runs[mode].append(_run_clients(thread.port, k, n, rate, duration, images, counter))
                            finally:
                                thread.stop()
                    entry = {mode: summarize(runs[mode], k if mode == "cobatched" else 1) for mode in MODES}
                    ratios = [len(c["latencies_ms"]) / c["span_s"] / (len(s["latencies_ms"]) / s["span_s"])
                              for c, s in zip(runs["cobatched"], runs["serial"])]
                    entry["speedup"] = float(np.median(ratios))
                    entry["speedup_reps"] = [round(r, 3) for r in ratios]
                    results.setdefault(str(n), {})[str(k)] = entry
                    for mode in MODES:
                        figures = entry[mode]
                        log(f"fleet N={n} K={k} {mode}: {figures['requests_per_s']:.2f} req/s, p50 "
                            f"{figures['p50_ms']:.0f} ms, p95 {figures['p95_ms']:.0f} ms, "
                            f"{figures['forwards_per_request']:.2f} forwards/request")
                    log(f"fleet N={n} K={k}: speed-up {entry['speedup']:.2f}x (reps {entry['speedup_reps']})")
        finally:
            policy.stop()
    return results


def method_text() -> str:
    """The method paragraph of this module's docstring, in markdown (for the results files)."""
    text = " ".join(__doc__.split("Method. ")[1].split("\n\n")[0].split())
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?(\w+)`", r"`\1`", text)
    return "Method: " + text.replace("``", "`")


def render_markdown(document: dict[str, Any]) -> str:
    header = (f"{document['date']}, commit `{document['commit']}`, {document['machine']['cpu_model']} "
              f"({document['machine']['usable_cores']} cores), torch threads {document['threads']}, forward threads "
              f"{document.get('forward_threads', 1)}, "
              f"{document['reps']} repetitions of {document['duration_s']:g} s per server, rate "
              f"{document['rate_hz']:g} Hz per client "
              f"(0 = back to back); load average at start {document['load_average_start']}, end "
              f"{document['load_average_end']}; the whole run took {document['wall_s']:.0f} s.")
    lines = [f"# Fleet on the OpenPI wire: co-batched vs one at a time ({document['model']} policy)", "", header, ""]
    columns = ("| K clients | co-batched req/s | serial req/s | speed-up | co-batched p50 / p95 ms | "
               "serial p50 / p95 ms | forwards/request co-batched / serial |")
    for n, by_k in document["fleet_by_candidates"].items():
        lines += [f"## N = {n} candidates per request", "", columns, "|--:|--:|--:|--:|--:|--:|--:|"]
        for k, modes in by_k.items():
            co, se = modes["cobatched"], modes["serial"]
            lines.append(f"| {k} | {co['requests_per_s']:.2f} | {se['requests_per_s']:.2f} | "
                         f"{modes['speedup']:.2f}x | {co['p50_ms']:.0f} / "
                         f"{co['p95_ms']:.0f} | {se['p50_ms']:.0f} / {se['p95_ms']:.0f} | "
                         f"{co['forwards_per_request']:.2f} / {se['forwards_per_request']:.2f} |")
        lines.append("")
    lines.append(document["method"])
    return "\n".join(lines) + "\n"


def render_plot(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_n = document["fleet_by_candidates"]
    fig, axes = plt.subplots(len(by_n), 2, figsize=(10, 3.6 * len(by_n)), squeeze=False)
    for row, (n, by_k) in enumerate(by_n.items()):
        ks = [int(k) for k in by_k]
        for mode, style in (("cobatched", "o-"), ("serial", "s--")):
            axes[row][0].plot(ks, [by_k[str(k)][mode]["requests_per_s"] for k in ks], style, label=mode)
            axes[row][1].plot(ks, [by_k[str(k)][mode]["p95_ms"] for k in ks], style, label=mode)
        axes[row][0].set(title=f"N={n}: answered requests per second", xlabel="clients K", ylabel="req/s")
        axes[row][1].set(title=f"N={n}: p95 latency", xlabel="clients K", ylabel="ms")
        for ax in axes[row]:
            ax.set_xticks(ks)
            ax.grid(alpha=0.3)
            ax.legend()
    fig.suptitle(f"OpenPI fleet, {document['model']} policy, {document['date'][:10]} ({document['commit']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Measure, then write the JSON, markdown and plot (``--through ray`` runs :mod:`.fleet_ray` instead: the bench's
    ``run_fleet`` picks)."""
    import torch

    from trajectory_ensemble_node.provenance import git_commit, utc_now

    from .report import load_average, machine_info

    threads = args.threads if getattr(args, "threads", None) is not None else 1
    if threads > 0:
        torch.set_num_threads(threads)
    if args.duration <= 0 or args.rate < 0:
        raise SystemExit(f"error: --duration must be > 0 and --rate >= 0, got {args.duration} and {args.rate}")
    out = Path(args.json or DEFAULT_JSON)
    document: dict[str, Any] = {"benchmark": "fleet", "date": utc_now(), "commit": git_commit(), "model": "toy",
                                "machine": machine_info(torch.device("cpu")), "threads": torch.get_num_threads(),
                                "load_average_start": load_average(), "clients": list(args.clients),
                                "candidates": list(args.candidates), "rate_hz": args.rate,
                                "duration_s": args.duration, "method": method_text()}
    started = time.monotonic()
    quiet = getattr(args, "quiet", False)
    reps = max(1, int(getattr(args, "reps", 1) or 1))
    document["reps"] = reps
    info: dict[str, Any] = {}
    by_n = measure(tuple(args.clients), tuple(args.candidates), args.rate, args.duration, reps,
                   log=(lambda *_: None) if quiet else (lambda line: print(line, file=sys.stderr, flush=True)),
                   info=info)
    document.update(forward_threads=info.get("forward_threads", 1), wall_s=time.monotonic() - started,
                    load_average_end=load_average(),
                    fleet=by_n[str(args.candidates[0])], fleet_by_candidates=by_n)
    document["speedup"] = {n: {k: modes["speedup"] for k, modes in by_k.items()} for n, by_k in by_n.items()}
    write_json(out, document)
    out.with_suffix(".md").write_text(render_markdown(document))
    render_plot(document, out.with_suffix(".png"))
    print(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')} ({document['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        sys.exit(client_main(sys.argv[2:]))
    sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'fleet'} --client ... (the bench runs it: "
             f"trajectory-ensemble bench --fleet); pid {os.getpid()}")
