"""The README and docs/ say what the code does: size, first commands, generated tables, links, and runnable snippets.

The two snippets a user copies first are run as written: the Python API block on the tiny model, and the rclpy client
block against the real node over DDS.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trajectory_ensemble_node import errors
from trajectory_ensemble_node.serving.params import PARAMETERS, validate
from trajectory_ensemble_node.cli import docs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_BYTES = 12288

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def code_blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang == language]


def one_block(language: str, marker: str) -> str:
    blocks = [b for b in code_blocks(README.read_text(), language) if marker in b]
    assert len(blocks) == 1, f"expected one ```{language} block in README.md containing {marker!r}, got {len(blocks)}"
    return blocks[0]


def shell_commands(text: str) -> list[str]:
    """Commands of the README's ```bash blocks in order, without comments and blank lines."""
    commands = []
    for block in code_blocks(text, "bash"):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                commands.append(line)
    return commands


def markdown_files() -> list[Path]:
    return [README, ROOT / "docker" / "README.md", *sorted(DOCS.rglob("*.md"))]


# --- README shape ---------------------------------------------------------------------------------------------------


def test_readme_fits_in_12_kib():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move depth to docs/ (limit {README_MAX_BYTES})"


def test_readme_first_two_commands_are_make_demo_then_make_test():
    assert shell_commands(README.read_text())[:2] == ["make demo", "make test"]


def test_readme_opens_with_the_demo_picture_committed_small():
    head = README.read_text().split("\n## ", 1)[0]
    images = [target for target in _LINK.findall(head) if target.endswith(".png")]
    assert images, "the README's first section shows the demo picture"
    for target in images:
        assert (README.parent / target).stat().st_size < 300 * 1024, target


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file_and_heading(path):
    broken = []
    for target in _LINK.findall(path.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # a URL
        file_part, _, anchor = target.partition("#")
        linked = path.parent / file_part if file_part else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)} links to missing files or headings: {broken}"


# --- generated docs -------------------------------------------------------------------------------------------------


def test_parameters_doc_is_what_the_generator_writes():
    expected = docs.render_parameters(PARAMETERS)
    assert (ROOT / docs.PARAMETERS_DOC).read_text() == expected, "run: trajectory-ensemble docs"


def test_parameters_doc_lists_every_parameter_once_with_its_default():
    text = docs.render_parameters(PARAMETERS)
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [spec.name for spec in PARAMETERS]
    reducer = next(row for row in rows if row.startswith("| `reducer`"))
    assert "| `mode` |" in reducer


def test_readme_error_table_and_errors_doc_are_what_the_generator_writes():
    table = errors.error_table()
    expected = docs.splice(README.read_text(), docs.render_error_summary(table))
    assert README.read_text() == expected, "run: trajectory-ensemble docs"
    assert (ROOT / docs.ERRORS_DOC).read_text() == docs.render_errors_doc(table), "run: trajectory-ensemble docs"


def test_readme_error_summary_names_every_code_once_under_its_kind():
    table = [("CANCELED", 40, "lifecycle", "the client canceled the goal"),
             ("OK", 0, "ok", "the trajectory is in the result"),
             ("PREEMPTED", 41, "lifecycle", "a newer goal took over")]
    summary = docs.render_error_summary(table)
    assert "| ok | 0 `OK` |" in summary
    assert "| lifecycle | 40 `CANCELED`, 41 `PREEMPTED` |" in summary
    assert "(docs/errors.md)" in summary


def test_error_table_renders_one_row_per_code_in_code_order_between_the_markers():
    table = [("CANCELED", 40, "lifecycle", "the client canceled the goal"),
             ("OK", 0, "success", "the trajectory is in the result"),
             ("UNKNOWN_REDUCER", 12, "refused", "no reducer | by that name")]
    text = f"intro\n{docs.ERRORS_BEGIN}\nstale row\n{docs.ERRORS_END}\noutro\n"
    spliced = docs.splice(text, docs.render_errors(table))
    assert spliced.startswith("intro\n") and spliced.endswith(f"{docs.ERRORS_END}\noutro\n")
    rows = [line for line in spliced.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows == ["| 0 | `OK` | success | the trajectory is in the result |",
                    "| 12 | `UNKNOWN_REDUCER` | refused | no reducer \\| by that name |",
                    "| 40 | `CANCELED` | lifecycle | the client canceled the goal |"]
    assert "stale row" not in spliced
    # Splicing is idempotent: a second run changes nothing.
    assert docs.splice(spliced, docs.render_errors(table)) == spliced


def test_splice_refuses_text_without_exactly_one_pair_of_markers():
    with pytest.raises(ValueError, match="marker"):
        docs.splice("no markers here", "body")
    with pytest.raises(ValueError, match="marker"):
        docs.splice(f"{docs.ERRORS_BEGIN}\n{docs.ERRORS_BEGIN}\n{docs.ERRORS_END}", "body")


def test_docs_check_reports_a_stale_file_and_writing_fixes_it(tmp_path):
    (tmp_path / "README.md").write_text(f"# x\n{docs.ERRORS_BEGIN}\n{docs.ERRORS_END}\n")
    table = [("OK", 0, "success", "done")]
    files = docs.expected_files(tmp_path, PARAMETERS, table)
    assert sorted(p.name for p in docs.out_of_date(files)) == ["README.md", "errors.md", "parameters.md"]
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    assert docs.out_of_date(docs.expected_files(tmp_path, PARAMETERS, table)) == []


def test_serve_yaml_sets_exactly_the_declared_parameters_with_their_defaults():
    config = yaml.safe_load((ROOT / "config" / "serve.yaml").read_text())
    values = config["/**/trajectory_ensemble"]["ros__parameters"]
    declared = [spec.name for spec in PARAMETERS]
    assert set(values) == set(declared), (f"only in serve.yaml: {sorted(set(values) - set(declared))}; "
                                          f"only in PARAMETERS: {sorted(set(declared) - set(values))}")
    different = {spec.name: (values[spec.name], spec.default) for spec in PARAMETERS
                 if values[spec.name] != spec.default}
    assert not different, f"config/serve.yaml value vs PARAMETERS default: {different}"


def test_readme_robot_parameter_file_is_valid():
    robot = yaml.safe_load(one_block("yaml", "ros__parameters"))
    values = robot["/**/trajectory_ensemble"]["ros__parameters"]
    params = validate(values)  # raises ParameterError naming every bad or unknown parameter
    assert params.action_dim == len(params.joint_names) == 10 and len(params.image_topics) == 3


# --- runnable snippets ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_readme_python_api_snippet_runs_on_the_tiny_model():
    snippet = one_block("python", "Cosmos3ActionModel")
    done = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # action [chunk, width], candidates [N, chunk, width], seeds[0] is the base seed, one forward per step for all 8.
    assert done.stdout.split() == ["(16,", "10)", "(8,", "16,", "10)", "1234", "10"], done.stdout


@pytest.mark.ros
@pytest.mark.slow
def test_readme_client_snippet_gets_a_trajectory_from_the_node_over_dds(tmp_path, ros_domain_id, ros_env):
    pytest.importorskip("rclpy")
    pytest.importorskip("trajectory_ensemble_msgs")
    from _node_harness import serve_node

    snippet = one_block("python", "ActionClient")
    # The snippet asks for 8 candidates and mode: the node must allow 8 and mode must fit droid_lerobot.
    served = serve_node(tmp_path, ros_domain_id, {"max_observation_age_s": 120.0})
    node, client = next(served)
    try:
        client.publish_image(2000)  # the camera frame the goal is served from
        done = subprocess.run([sys.executable, "-c", snippet], env=ros_env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:] + node.log()[-3000:]
        assert "refused or failed" not in done.stdout and "base_seed" in done.stdout, done.stdout
        published = client.wait(lambda: client.messages("trajectory"), 10, "~/trajectory")[-1]
        assert (published.horizon, published.action_dim, published.candidate_count) == (8, 10, 8)
        assert published.reducer == "mode" and published.header.stamp.sec == 2000
        assert f"base_seed {published.base_seed}" in done.stdout
    finally:
        served.close()
