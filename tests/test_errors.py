"""errors.py: every named error is defined there, and every code has one kind and one meaning (the README's table)."""

from __future__ import annotations

import ast
from pathlib import Path

from trajectory_ensemble_node import errors
from trajectory_ensemble_node.errors import ERROR_KINDS, ErrorCode, error_table

PACKAGE_ROOT = Path(errors.__file__).resolve().parent


def test_error_table_lists_every_code_once_with_a_kind_and_a_meaning():
    table = error_table()
    assert [name for name, *_ in table] == sorted((c.name for c in ErrorCode), key=lambda n: ErrorCode[n])
    assert len({name for name, *_ in table}) == len(ErrorCode)
    for name, value, kind, meaning in table:
        assert ErrorCode[name] == value
        assert kind in ERROR_KINDS == ("ok", "refusal", "observation", "engine failure", "lifecycle", "configuration")
        assert meaning and meaning.endswith(".") and "\n" not in meaning, name
    assert table[0] == ("OK", 0, "ok", "The trajectory was published and the goal succeeded.")


def test_codes_match_their_meaning():
    kinds = {name: kind for name, _, kind, _ in error_table()}
    # A refused rollout never ran: it is not an engine failure (the node's diagnostics only warn on those).
    assert errors.RolloutError.code == ErrorCode.ROLLOUT_FAILURE and kinds["ROLLOUT_FAILURE"] == "refusal"
    # Capacity refusals have their own code, not INVALID_REQUEST.
    assert errors.GoalRejectedError.code == errors.CapacityError.code == ErrorCode.CAPACITY == 15
    assert kinds["CAPACITY"] == "refusal"
    assert errors.ParameterError.code == ErrorCode.INVALID_PARAMETERS and kinds["INVALID_PARAMETERS"] == "configuration"
    assert errors.ModelLoadError.code == ErrorCode.MODEL_LOAD_FAILED
    assert errors.FrameError.code == ErrorCode.INVALID_FRAME and kinds["INVALID_FRAME"] == "observation"
    assert {kinds[c.name] for c in (ErrorCode.ENGINE_FAILURE, ErrorCode.OUT_OF_MEMORY,
                                     ErrorCode.NON_FINITE_CANDIDATES)} == {"engine failure"}


def _error_classes_outside_errors_py(root: Path, named: set[str]) -> list[tuple[str, str]]:
    """(path relative to root's parent, class name) of every class under ``root`` deriving from a named error."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == PACKAGE_ROOT / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if bases & named:
                    found.append((str(path.relative_to(root.parent)), node.name))
    return found


def test_goal_errors_live_in_errors_py_and_tool_errors_in_their_tools():
    # The errors a goal, a group or a request can end with are central (errors.py, beside ErrorCode); an offline
    # tool's own errors (a bag it cannot read, a node it cannot reach) live in that tool (the replay-test fixture
    # included), and the lab's in the lab.
    named = {name for name, value in vars(errors).items() if isinstance(value, type) and issubclass(value, Exception)}
    outside = _error_classes_outside_errors_py(PACKAGE_ROOT, named)
    assert outside, "the tools define their own errors"
    # The offline tools live by concern (cli/, replay/, calibration/, demo/); testing.py is the teams' fixture.
    tool_homes = tuple(f"{PACKAGE_ROOT.name}/{home}" for home in ("cli/", "replay/", "calibration/", "demo/", "testing.py"))
    misplaced = [f"{path}: {name}" for path, name in outside if not path.startswith(tool_homes)]
    assert misplaced == []
    tool_errors = {name for _, name in outside}
    assert {"BagError", "NodeStartError", "NodeUnreachableError", "ParameterValueError"} <= tool_errors
    assert not tool_errors & named, "a tool error is defined twice"
    lab = PACKAGE_ROOT.parent / "lab" / "trajectory_ensemble_lab"
    assert {name for _, name in _error_classes_outside_errors_py(lab, named)} >= {"GrpoError", "RosGrpoError"}


def test_a_reported_error_is_rebuilt_as_its_class_with_the_senders_message():
    # A remote engine's frame and a replica's payload carry type(error).__name__, its code and str(error).
    sent = errors.GroupCanceledError("g-1", "client went away")
    back = errors.rebuild_error(type(sent).__name__, str(sent), code=int(sent.code), request_id="g-1")
    assert type(back) is errors.GroupCanceledError and str(back) == "client went away" and back.request_id == "g-1"
    assert back.reason == errors.AbortReason.CANCELED
    aborted = errors.rebuild_error("GroupAbortedError", "the model raised", code=int(ErrorCode.ENGINE_FAILURE))
    assert type(aborted) is errors.GroupAbortedError and aborted.request_id == "" and str(aborted) == "the model raised"
    # An unknown name, a name that is no error class, or a known name with another code is not rebuilt.
    assert errors.rebuild_error("SomeOtherError", "m", code=17) is None
    assert errors.rebuild_error("ErrorCode", "m", code=int(ErrorCode.ENGINE_FAILURE)) is None
    assert errors.rebuild_error("describe_error", "m", code=int(ErrorCode.ENGINE_FAILURE)) is None
    assert errors.rebuild_error("GroupCanceledError", "m", code=int(ErrorCode.ENGINE_FAILURE)) is None
