"""The node's output topics: ``~/trajectory``, ``~/candidates``, ``~/joint_trajectory`` and ``~/markers``.

Only a finished, validated result is ever published (a failed group has none), so a goal that ends ABORTED
publishes nothing. Every message carries the stamp and frame of the observation the group was drawn for: row ``k``
executes at ``header.stamp + (k + 1) * dt``, the times a controller splices consecutive chunks at (a continued
chunk's frozen rows equal the previous chunk's rows at the same times). ``~/markers`` (with ``publish_markers``) draws
the same candidates and trajectory for RViz and Foxglove (:mod:`.markers`).
"""

from __future__ import annotations

from typing import Any

from rclpy.qos import QoSProfile
from trajectory_ensemble_msgs.msg import ActionTrajectory, CandidateArray
from trajectory_msgs.msg import JointTrajectory

from ..contract import EnsembleResult
from ..reducers import mode_clusters
from ..serving.observations import Observation
from .conversions import candidates_msg, joint_trajectory_msg, make_header, trajectory_msg


class OutputTopics:
    """The publishers of one node, and how a result becomes their messages.

    Args:
        node (`rclpy.node.Node`): The node the publishers belong to.
        params (`NodeParams`): ``domain_name``, ``dt``, ``joint_names`` (no ``~/joint_trajectory`` without them),
            ``publish_candidates``, ``publish_markers`` and the ``marker_*`` settings.
    """

    def __init__(self, node: Any, params: Any) -> None:
        self.params = params
        reliable = QoSProfile(depth=10)
        self.trajectory = node.create_publisher(ActionTrajectory, "~/trajectory", reliable)
        self.candidates = node.create_publisher(CandidateArray, "~/candidates", reliable)
        self.joints = (node.create_publisher(JointTrajectory, "~/joint_trajectory", reliable)
                       if params.joint_names else None)
        self.markers = None
        if params.publish_markers:
            from visualization_msgs.msg import MarkerArray

            self.markers = node.create_publisher(MarkerArray, "~/markers", reliable)

    def destroy(self, node: Any) -> None:
        """Destroy every publisher (the node's ``cleanup``)."""
        for publisher in (self.trajectory, self.candidates, self.joints, self.markers):
            if publisher is not None:
                node.destroy_publisher(publisher)

    def publish(self, result: EnsembleResult, observation: Observation, *, normalized: bool,
                publish_candidates: bool, model_space: Any = None) -> tuple[ActionTrajectory, CandidateArray | None]:
        """Publish ``result`` and return its trajectory and candidates messages (for the action result).

        Args:
            result (`EnsembleResult`): The finished group.
            observation (`Observation`): What it was drawn for (stamp and frame of every message).
            normalized (`bool`): No action statistics: the data is in the model's normalized space.
            publish_candidates (`bool`): Also publish ``~/candidates`` (the goal or the node asked for them).
        """
        p = self.params
        header = make_header(observation.stamp, observation.frame_id)
        trajectory = trajectory_msg(result, header=header, domain_name=p.domain_name, dt=p.dt, normalized=normalized)
        candidates = None
        if result.candidates is not None:
            candidates = candidates_msg(result, header=header, domain_name=p.domain_name, dt=p.dt,
                                        normalized=normalized)
        self.trajectory.publish(trajectory)
        if candidates is not None and publish_candidates:
            self.candidates.publish(candidates)
        if self.joints is not None:
            self.joints.publish(joint_trajectory_msg(result.action, joint_names=p.joint_names, dt=p.dt,
                                                     header=header))
        if self.markers is not None:
            self.markers.publish(self._markers(result, observation, model_space))
        return trajectory, candidates

    def _markers(self, result: EnsembleResult, observation: Observation, model_space: Any) -> Any:
        from .markers import build_markers, cluster_labels

        p = self.params
        candidates = valid = labels = None
        if result.candidates is not None:
            candidates = result.candidates.detach().float().cpu()
            n = candidates.shape[0]
            valid = list(result.candidate_valid) if result.candidate_valid is not None else [True] * n
            kept = [i for i in range(n) if valid[i]]
            space = model_space(candidates[kept]) if model_space is not None else candidates[kept]
            clusters = [[kept[j] for j in members] for members in mode_clusters(space)] if kept else []
            labels = cluster_labels(n, clusters)
            candidates = candidates.numpy()
        return build_markers(result.action.detach().float().cpu().numpy(), candidates, valid, labels,
                             channels=p.marker_channels, frame_id=p.marker_frame_id, stamp=observation.stamp,
                             lifetime_s=p.marker_lifetime_s)
