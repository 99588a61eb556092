"""The fuzz run of ``make soak`` (issue 45): every fuzz target under the ``ci`` and ``soak`` profiles, its example
counts, and the "Fuzzing" section of ``docs/reliability.md``.

``tests/reliability/soak.py`` rewrites ``docs/reliability.md`` from its own figures, so this runs after it and puts
the Fuzzing section back (replacing an older one). Writes ``bench/results/fuzz.json``; exit status 1 when a profile's
run fails (a fuzzer found an unnamed exception, a hang or a wrong result: pytest's output above says which, with the
``@reproduce_failure`` blob to replay it)::

    PYTHONPATH=. python tests/fuzz/soak_report.py [--profiles ci soak] [--doc-only]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FUZZ = Path(__file__).resolve().parent
sys.path.insert(0, str(FUZZ))

from _fuzz import COUNTS_ENV, EXAMPLES, PROFILE_ENV  # noqa: E402

TARGETS = {
    "wire": ("`test_fuzz_wire.py`", "`wire/codec.py` `unpack`: random bytes, nested msgpack, 20,000-deep nesting, "
             "huge container headers, ndarray/npgeneric maps with wrong dtype, shape and data"),
    "wire_arrays": ("`test_fuzz_wire.py`", "`unpack` of well-formed arrays of every accepted dtype: decoded exactly"),
    "schemas": ("`test_fuzz_schemas.py`", "`get_schema(name).parse` for `toy` and `droid` (both count here): wrong "
                "types, dtypes, shapes, NaN state, ragged lists, thin and over-limit images, mixed layouts"),
    "server": ("`test_fuzz_server.py`", "one served websocket connection (toy policy): hostile frames and extras; "
               "then the connection and a fresh client are served"),
    "observations": ("`test_fuzz_observations.py`", "`image_to_rgb` on duck-typed `sensor_msgs/Image` fields"),
    "observation_buffer": ("`test_fuzz_observations.py`", "`ObservationBuffer` image and state sequences; goals "
                           "served from it"),
    "params_tree": ("`test_fuzz_params_file.py`", "params files dumped from generated trees: wrong types, unknown "
                    "and non-string keys, NaN/Inf, integers past 64 bits"),
    "params_text": ("`test_fuzz_params_file.py`", "params files from hostile YAML text: `!!python/*` tags, alias "
                    "bombs, self-references, deep nesting, 5,000-digit integers, non-UTF-8"),
    "bag_payloads": ("`test_fuzz_bags.py`", "rosbag2 (mcap, sqlite3) with damaged CDR payloads, read as replay "
                     "reads them"),
    "bag_files": ("`test_fuzz_bags.py`", "rosbag2 folders with damaged `metadata.yaml` or storage files"),
}

DEFECTS = [
    ("params file: a mapping that holds itself (`&r {x: *r}`), or namespaces nested past Python's recursion limit",
     "`RecursionError`", "fixed: the section walk in `ros/params_file.py` is iterative and bounded (32 levels, "
     "4,096 namespace maps) -> `INVALID_PARAMETERS`"),
    ("params file: a billion-laughs of namespace maps (40 aliases, 2**40 paths)", "never returned",
     "fixed: the same bound"),
    ("params file: a flow collection nested 1,500 deep; non-UTF-8 bytes; a 5,000-digit integer", "`RecursionError`, "
     "`UnicodeDecodeError`, `ValueError`", "fixed: named `INVALID_PARAMETERS` in `read_params_file`"),
    ("params: a non-string key (`1: 2`) beside parameter names", "`TypeError` sorting the unknown keys",
     "fixed: named as an unknown parameter (`ros/params.py`)"),
    ("params: `fps: <a 400-digit integer>`", "`OverflowError` converting to float", "fixed: refused by name"),
    ("params: `.inf` for a float parameter (`observation_wait_s: .inf` overflows the frame wait, `fps: .inf` gives "
     "dt 0); integers outside int64", "accepted", "fixed: refused as not finite / not a 64-bit integer"),
    ("params: a list alias bomb as a value; an integer of more than 4,300 digits inside a bad value",
     "`repr()` never returned; `ValueError`", "fixed: bad values are quoted through a bounded preview"),
    ("OpenPI schemas: a ragged state list (`observation/joint_position: [[1.0], [1.0, 2.0]]`)", "`ValueError` "
     "(an anonymous `ENGINE_FAILURE` frame on the wire)", "fixed in `openpi/schemas.py` (36d612c, issue 45 row 7): "
     "`OBSERVATION_SCHEMA`"),
    ("replay: a bag that declares its image topic but holds no frame on it", "bare `StopIteration` from "
     "`playback.goal_times` after the up-front check passed (0 messages)", "fixed in b01a045: refused by the "
     "up-front check, `BagError`; `test_fuzz_bags.py::test_an_image_topic_without_messages_is_refused_by_name`"),
    ("replay: an mcap bag whose `metadata.yaml` names a topic (or its type) by a list", "`TypeError` (unhashable) "
     "in `playback.resolve_inputs`", "fixed in `tools/bags.py` `bag_info`: `BagError` (exit 2); "
     "`test_bag_check.py::test_a_topic_whose_metadata_is_not_text_is_a_bad_bag`"),
]


def run_profile(profile: str) -> dict[str, Any]:
    """Run ``tests/fuzz`` under ``profile``; its exit status, seconds and examples per target."""
    with tempfile.TemporaryDirectory(prefix="fuzz_counts_") as folder:
        counts_path = Path(folder) / "counts.json"
        env = {**os.environ, PROFILE_ENV: profile, COUNTS_ENV: str(counts_path)}
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", str(FUZZ), "-q", "-p", "no:cacheprovider",
                               "--hypothesis-show-statistics"], cwd=REPO, env=env)
        seconds = time.monotonic() - started
        counts = json.loads(counts_path.read_text())["counts"] if counts_path.exists() else {}
    return {"returncode": proc.returncode, "seconds": round(seconds, 1), "counts": counts,
            "budget": {target: budgets[profile] for target, budgets in EXAMPLES.items()}}


def section(figures: dict[str, Any]) -> str:
    runs = figures["runs"]
    lines = [
        "## Fuzzing",
        "",
        f"`make soak` (`tests/fuzz/soak_report.py`), {figures['date']}, commit `{figures['commit']}`, "
        f"{figures['machine']}. Raw figures: `bench/results/fuzz.json`.",
        "",
        "**Method.** Property-based tests (hypothesis) in `tests/fuzz/` drive every hostile input surface with "
        "generated input; each example must end in one of two outcomes: a named error with its code (and, for the "
        "server, a connection that goes on serving), or a valid result. Profile `ci` runs in `make test`: "
        "derandomized, so a failure reproduces from the commit alone. Profile `soak` "
        "(`TRAJECTORY_ENSEMBLE_FUZZ_PROFILE=soak`) runs here, with random seeds and hypothesis' example database. "
        "Counts are the examples each target ran (explicit `@example` cases and shrinking included; `schemas` "
        "adds its two schemas).",
        "",
        "| target | file | what it feeds | " + " | ".join(f"`{p}` examples" for p in runs) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in runs) + " |",
    ]
    for target, (path, what) in TARGETS.items():
        cells = [str(run["counts"].get(target, 0)) for run in runs.values()]
        lines.append(f"| `{target}` | {path} | {what} | " + " | ".join(cells) + " |")
    lines += [
        "| all | | | " + " | ".join(f"{sum(run['counts'].values())} in {run['seconds']:.0f} s, "
                                     f"{'passed' if run['returncode'] == 0 else 'FAILED'}" for run in runs.values())
        + " |",
        "",
        *([] if all(run["returncode"] == 0 for run in runs.values()) else [
            "A FAILED run stops the failing target at its first counterexample (its count is then below its "
            "budget); pytest's output of the run names it, and the defects below say which were open then.", ""]),
        "**Defects the fuzzers found** (issue 45):",
        "",
        "| input | what happened | status |",
        "| --- | --- | --- |",
        *[f"| {found} | {what} | {status} |" for found, what, status in DEFECTS],
        "",
    ]
    return "\n".join(lines)


def write_section(doc: Path, text: str) -> None:
    """Replace the doc's "## Fuzzing" section (up to the next "## " heading), or append it."""
    old = doc.read_text() if doc.exists() else "# Reliability\n"
    start = old.find("\n## Fuzzing\n")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + 1)
        new = old[:start + 1] + text + ("" if end < 0 else "\n" + old[end + 1:])
    doc.write_text(new)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["ci", "soak"], choices=["ci", "soak"])
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "fuzz.json")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "reliability.md")
    parser.add_argument("--doc-only", action="store_true", help="rewrite the doc's section from --json")
    args = parser.parse_args()
    if args.doc_only:
        write_section(args.doc, section(json.loads(args.json.read_text())))
        return 0
    figures: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip(),
        "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start",
        "runs": {},
    }
    for profile in args.profiles:
        print(f"fuzz: profile {profile}", flush=True)
        figures["runs"][profile] = run_profile(profile)
        print(f"fuzz: {profile}: {figures['runs'][profile]['counts']}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=1) + "\n")
    write_section(args.doc, section(figures))
    return 0 if all(run["returncode"] == 0 for run in figures["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
