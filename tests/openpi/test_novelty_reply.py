"""OpenPI replies carry observation novelty as the node's results do (issue 33): the real ``openpi-client`` against a
server whose policy loads a novelty calibration (``_node_harness.toy_novelty_calibration``, rule ``novelty``)."""

from __future__ import annotations

import pytest

WebsocketClientPolicy = pytest.importorskip("openpi_client.websocket_client_policy").WebsocketClientPolicy

from _node_harness import toy_novelty_calibration  # noqa: E402
from _openpi_harness import serving  # noqa: E402

from trajectory_ensemble_node.openpi import OpenPIPolicy  # noqa: E402
from trajectory_ensemble_node.serving.params import validate  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]


def test_replies_report_novelty_score_novel_and_the_rule(tmp_path):
    cal = toy_novelty_calibration(tmp_path)
    policy = OpenPIPolicy.from_params(validate({"uncertainty_calibration_file": str(cal.calibration_file),
                                                "novelty_scorer_file": str(cal.scorer_file)}))
    policy.start()
    try:
        with serving(policy) as server:
            client = WebsocketClientPolicy(host="127.0.0.1", port=server.port)
            replies = [client.infer({"observation/image": image, "seed": 5, "num_candidates": 4})
                       for image, _ in (cal.normal, cal.shifted)]
    finally:
        policy.stop()
    for reply, (_, score), novel in zip(replies, (cal.normal, cal.shifted), (False, True)):
        assert reply["novelty_score"] == pytest.approx(score, rel=1e-6)
        assert reply["novel"] is novel and reply["uncertain"] is novel and reply["uncertainty_rule"] == "novelty"
        assert reply["metrics"]["novelty_threshold"] == pytest.approx(cal.threshold)
