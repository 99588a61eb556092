"""Fuzz the node's params file: ``serving/params_file.py:read_params_file`` then ``serving/params.py:validate``.

``serve-openpi --params-file`` and ``calibrate --bag --params-file`` read the YAML the node does, without rclpy. Two
generators: parameter trees dumped as YAML (wrong types, unknown and non-string keys, NaN and Inf, integers far past
64 bits, nested junk, sections for other nodes), and YAML text assembled from hostile fragments (``!!python/...``
tags, alias bombs and self-referencing anchors, deep nesting, 5,000-digit integers, non-UTF-8 bytes). Each file must
give :class:`NodeParams` (every number finite, every integer one a ROS parameter can hold) or a ``ParameterError``
(INVALID_PARAMETERS, 52) that names the offending key; no YAML tag may construct an object.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from _fuzz import TIMEOUT_S, check_named, fuzz_settings, record
from hypothesis import event, example, given
from hypothesis import strategies as st

from trajectory_ensemble_node.errors import ErrorCode
from trajectory_ensemble_node.serving.params import PARAMETER_NAMES, PARAMETERS, NodeParams, validate
from trajectory_ensemble_node.serving.params_file import read_params_file

pytestmark = pytest.mark.timeout(TIMEOUT_S)

NODE = "/trajectory_ensemble"
INT64 = (-(2**63), 2**63 - 1)
DEFAULTS = {spec.name: spec.default for spec in PARAMETERS}

# --- parameter trees -------------------------------------------------------------------------------------------------

huge_ints = st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30, -(10**30), 10**400, -(16**1200)])
numbers = st.one_of(st.integers(-(2**70), 2**70), huge_ints, st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, 1, 0.0, 1e308, -0.0]))
leaves = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=12), st.sampled_from(["", "auto", "toy", "cpu",
                                                                                            "cuda:0", "preempt"]))
junk_values = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                           st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                           max_leaves=12)


@st.composite
def parameter_values(draw: st.DrawFn, name: str) -> Any:
    """A value for ``name``: its default, one near it, or junk."""
    default = DEFAULTS[name]
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return default
    if choice == 1 and isinstance(default, (int, float)) and not isinstance(default, bool):
        return draw(numbers)
    if choice == 2 and isinstance(default, list):
        return draw(st.lists(st.one_of(st.integers(-3, 40), huge_ints, st.text(max_size=6), st.none(), st.booleans()),
                             max_size=5))
    return draw(junk_values)


@st.composite
def parameter_sections(draw: st.DrawFn) -> dict[Any, Any]:
    names = draw(st.lists(st.sampled_from(PARAMETER_NAMES), max_size=6, unique=True))
    params: dict[Any, Any] = {name: draw(parameter_values(name)) for name in names}
    for key in draw(st.lists(st.one_of(st.text(max_size=10), st.integers(-5, 5), st.booleans(), st.none(),
                                       st.floats(allow_nan=False)), max_size=2)):
        params.setdefault(key, draw(junk_values))  # unknown and non-string keys
    return params


section_keys = st.one_of(st.sampled_from(["/**/trajectory_ensemble", "trajectory_ensemble", "/trajectory_ensemble",
                                          "/**", "/*", "**", "/other", "/ns/trajectory_ensemble", "/**/*", "",
                                          "/*/**/trajectory_*"]),
                         st.text(max_size=10), st.integers(-3, 3), st.none())


@st.composite
def parameter_trees(draw: st.DrawFn) -> Any:
    """A params-file tree: sections (some nested in namespaces) for this node and others, or something else."""
    if not draw(st.integers(0, 9)):
        return draw(junk_values)  # a scalar or a list at the top
    tree: dict[Any, Any] = {}
    for key in draw(st.lists(section_keys, min_size=1, max_size=3)):
        body: Any = {"ros__parameters": draw(parameter_sections())} if draw(st.integers(0, 5)) else draw(junk_values)
        if isinstance(body, dict) and not draw(st.integers(0, 3)):
            body = {draw(st.sampled_from(["trajectory_ensemble", "ns", "*"])): body}  # nested namespace form
        tree[key] = body
    return tree


# --- YAML text -------------------------------------------------------------------------------------------------------

_CANARY_DIR = tempfile.TemporaryDirectory(prefix="fuzz_canary_")  # removed at exit
CANARY = Path(_CANARY_DIR.name) / "constructed"
"""A file a ``!!python/object/apply`` tag would create, were any tag ever constructed."""


def _bomb(levels: int, kind: str) -> str:
    # A billion-laughs document: each anchor refers to the previous one twice (2**levels paths, as lists or maps).
    lines = ["a0: &a0 [1, 2]" if kind == "list" else "a0: &a0 {x: 1}"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" if kind == "list" else
                     f"a{i}: &a{i} {{p: *a{i - 1}, q: *a{i - 1}}}")
    return "\n".join(lines) + "\n"


def fragments(canary: Path) -> st.SearchStrategy[bytes]:
    header = "/**/trajectory_ensemble:\n  ros__parameters:\n"
    texts = st.one_of(
        st.sampled_from([
            f"{header}    model: !!python/object/apply:builtins.open ['{canary}', 'w']\n",
            f"{header}    fps: !!python/object/new:builtins.float [3]\n",
            f"{header}    device: !!python/name:os.system\n",
            f"{header}    seed: !!python/object:collections.OrderedDict {{}}\n",
            f"!!python/object/apply:builtins.open ['{canary}', 'w']\n",
            f"{header}    image_topics: !!set {{a, b}}\n",
            f"{header}    instruction: !!binary aGVsbG8=\n",
            f"{header}    domain_name: !!timestamp 2001-12-14t21:59:43.10-05:00\n",
            f"{header}    fps: !!float .nan\n",
            f"{header}    fps: .inf\n",
            f"{header}    observation_wait_s: .inf\n",
            f"{header}    marker_lifetime_s: -.inf\n",
            f"{header}    seed: 0x" + "f" * 1200 + "\n",
            f"{header}    seed: -0x" + "f" * 1200 + "\n",
            f"{header}    seed: 0x" + "f" * 4000 + "\n",  # past 4,300 decimal digits: no repr()
            f"{header}    warmup_counts: [0x" + "f" * 4000 + "]\n",
            f"{header}    fps: " + "9" * 5000 + "\n",
            f"{header}    fps: " + "9" * 400 + "\n",
            f"{header}    chunk_size: 0b" + "1" * 200 + "\n",
            f"{header}    <<: {{fps: 3}}\n",
            f"{header}    1: 2\n    fps: 3\n",
            f"{header}    ? [a, b]\n    : c\n",
            f"{header}    fps: &x [*x]\n",
            "&r {x: *r, /**/trajectory_ensemble: {ros__parameters: {fps: 3}}}\n",
            "/**/trajectory_ensemble: &n {ros__parameters: {fps: 3}, ns: *n}\n",
            "/**/trajectory_ensemble:\n  ros__parameters:\n\tfps: 3\n",
            "%YAML 1.1\n---\na: 1\n...\n---\nb: 2\n",
            "\ufeff/**/trajectory_ensemble:\n  ros__parameters: {fps: 4}\n",
            "",
        ]),
        st.integers(1, 40).map(lambda n: _bomb(n, "map")),
        st.integers(1, 40).map(lambda n: _bomb(n, "list") + f"/**/trajectory_ensemble:\n  ros__parameters:\n"
                                                           f"    fps: *a{n}\n"),
        st.integers(1, 40).map(lambda n: _bomb(n, "map") + f"/**/trajectory_ensemble:\n  ros__parameters:\n"
                                                          f"    instruction: *a{n}\n"),
        # Deep nesting: flow collections past Python's recursion limit, block mappings past the namespace limit.
        st.integers(1, 1500).map(lambda n: "a: " + "[" * n + "]" * n + "\n"),
        st.integers(1, 1500).map(lambda n: "a: " + "{b: " * n + "1" + "}" * n + "\n"),
        st.integers(1, 80).map(lambda n: "".join(f"{' ' * 2 * i}n{i}:\n" for i in range(n)) + " " * 2 * n
                               + "ros__parameters: {fps: 3}\n"),
        st.text(max_size=60),
    ).map(lambda text: text.encode("utf-8", "surrogatepass"))
    return st.lists(st.one_of(texts, texts, texts, st.binary(max_size=24)), min_size=1, max_size=3).map(b"".join)


# --- the property ----------------------------------------------------------------------------------------------------


def _check_file(content: bytes, tree: Any = None) -> None:
    with tempfile.TemporaryDirectory(prefix="fuzz_params_") as folder:
        path = Path(folder) / "params.yaml"
        path.write_bytes(content)
        try:
            params = validate(read_params_file(str(path), NODE), env={})
        except Exception as error:  # noqa: BLE001 - the property: only named errors
            check_named(error, {ErrorCode.INVALID_PARAMETERS})
            message = str(error)
            assert message.startswith("invalid parameters:\n  "), message[:200]
            event("refused")
            if isinstance(tree, dict):
                _check_names_unknown_keys(tree, message)
            return
        finally:
            assert not CANARY.exists(), "a YAML tag constructed an object"
    event("accepted")
    assert isinstance(params, NodeParams)
    for field in dataclasses.fields(NodeParams):
        value = getattr(params, field.name)
        values = value if isinstance(value, tuple) else (value,)
        for item in values:
            if isinstance(item, float):
                assert math.isfinite(item), f"{field.name} accepted as {item}"
            elif isinstance(item, int) and not isinstance(item, bool):
                assert INT64[0] <= item <= INT64[1], f"{field.name} accepted as {item}, beyond a ROS integer"


def _check_names_unknown_keys(tree: dict[Any, Any], message: str) -> None:
    # Every unknown key of a section that applies to this node is named in the refusal.
    if "params file" in message:
        return
    for key, body in tree.items():
        if key == "/**/trajectory_ensemble" and isinstance(body, dict) and isinstance(body.get("ros__parameters"),
                                                                                      dict):
            for name in body["ros__parameters"]:
                if name not in PARAMETER_NAMES:
                    assert f"{name}: unknown parameter" in message, (name, message[:400])


@fuzz_settings("params_tree")
@given(parameter_trees())
@example({"/**/trajectory_ensemble": {"ros__parameters": {1: 2, "a": 3}}})
@example({"/**/trajectory_ensemble": {"ros__parameters": {"fps": 10**400}}})
@example({"/**/trajectory_ensemble": {"ros__parameters": {"fps": math.inf}}})
@example({"/**/trajectory_ensemble": {"ros__parameters": {"seed": 2**64}}})
@example({"/**/trajectory_ensemble": {"ros__parameters": {}}})
def test_any_parameter_tree_gives_valid_params_or_a_refusal_that_names_the_key(tree: Any) -> None:
    record("params_tree")
    _check_file(yaml.safe_dump(tree, allow_unicode=True).encode(), tree)


@fuzz_settings("params_text")
@given(fragments(CANARY))
@example(_bomb(40, "map").encode())
@example(_bomb(40, "list").encode() + b"/**/trajectory_ensemble:\n  ros__parameters:\n    fps: *a40\n")
@example(b"/**/trajectory_ensemble:\n  ros__parameters:\n    model: \xff\xfe\n")
def test_any_yaml_text_gives_valid_params_or_a_named_refusal_and_constructs_nothing(content: bytes) -> None:
    record("params_text")
    _check_file(content)
