"""``~/markers``: a goal's candidates and its served trajectory as a ``visualization_msgs/MarkerArray``.

A ``DELETEALL``, one strip per candidate coloured by its mode cluster (red when dropped), one thicker strip for the
served trajectory (:data:`SERVED_ID`), in namespace :data:`NAMESPACE`; what each shows and which channels:
docs/node.md, "Markers for RViz and Foxglove".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from builtin_interfaces.msg import Duration, Time
from geometry_msgs.msg import Point
from std_msgs.msg import ColorRGBA, Header
from visualization_msgs.msg import Marker, MarkerArray

NAMESPACE = "trajectory_ensemble"
SERVED_ID = 1_000_000
"""The served trajectory's marker id: above any candidate id (counts are bounded by ``max_candidates``)."""
CANDIDATE_WIDTH = 0.01
SERVED_WIDTH = 0.04
INVALID_COLOR = (0.9, 0.1, 0.1, 0.9)
SERVED_COLOR = (1.0, 1.0, 1.0, 1.0)
CLUSTER_COLORS: tuple[tuple[float, float, float, float], ...] = (
    (0.12, 0.47, 0.71, 0.8), (1.0, 0.5, 0.05, 0.8), (0.17, 0.63, 0.17, 0.8), (0.58, 0.4, 0.74, 0.8),
    (0.55, 0.34, 0.29, 0.8), (0.89, 0.47, 0.76, 0.8), (0.5, 0.5, 0.5, 0.8), (0.74, 0.74, 0.13, 0.8),
    (0.09, 0.75, 0.81, 0.8),
)
"""One colour per mode cluster, in cluster order (the largest first), cycling past nine; none of them is red."""


def cluster_labels(num_candidates: int, clusters: Sequence[Sequence[int]]) -> list[int]:
    """Candidate position -> the rank of its cluster by size (0 = the largest; ties by lowest member).

    Args:
        num_candidates (`int`): N.
        clusters (`Sequence[Sequence[int]]`): The clusters of the valid candidates, as candidate positions.
    """
    ranked = sorted(clusters, key=lambda members: (-len(members), min(members)))
    labels = [-1] * num_candidates
    for rank, members in enumerate(ranked):
        for position in members:
            labels[position] = rank
    return labels


def _strip(header: Header, marker_id: int, rows: np.ndarray, channels: tuple[int, ...], width: float,
           color: tuple[float, float, float, float], lifetime: Duration) -> Marker:
    marker = Marker(header=header, ns=NAMESPACE, id=marker_id, type=Marker.LINE_STRIP, action=Marker.ADD,
                    lifetime=lifetime, frame_locked=False)
    marker.pose.orientation.w = 1.0
    marker.scale.x = width
    marker.color = ColorRGBA(r=color[0], g=color[1], b=color[2], a=color[3])
    z = rows[:, channels[2]] if len(channels) == 3 else np.zeros(len(rows))
    xyz = np.stack([rows[:, channels[0]], rows[:, channels[1]], z], axis=1)
    # RViz refuses a whole marker for one NaN point; a dropped candidate may hold some (that is why it was dropped).
    marker.points = [Point(x=float(x), y=float(y), z=float(h)) for x, y, h in xyz[np.isfinite(xyz).all(axis=1)]]
    return marker


def build_markers(
    trajectory: np.ndarray,
    candidates: np.ndarray | None,
    valid: Sequence[bool] | None,
    labels: Sequence[int] | None,
    *,
    channels: Sequence[int],
    frame_id: str,
    stamp: Time,
    lifetime_s: float,
) -> MarkerArray:
    """The markers of one served goal.

    Args:
        trajectory (`np.ndarray` of shape `[H, D]`): The served trajectory, as published on ``~/trajectory``.
        candidates (`np.ndarray` of shape `[N, H, D]`, *optional*): The candidates, as published on ``~/candidates``.
        valid (`Sequence[bool]` of length `N`, *optional*): Which candidates passed the validity checks.
        labels (`Sequence[int]` of length `N`, *optional*): Each candidate's cluster rank (:func:`cluster_labels`);
            -1 for a dropped candidate.
        channels (`Sequence[int]`): Action channels drawn as x, y (and z).
        frame_id (`str`): The markers' frame.
        stamp (`builtin_interfaces/Time`): The observation's stamp (the trajectory's).
        lifetime_s (`float`): Seconds each marker stays up; 0 keeps it until replaced.
    """
    header = Header(frame_id=frame_id, stamp=stamp)
    whole, frac = divmod(max(float(lifetime_s), 0.0), 1.0)
    lifetime = Duration(sec=int(whole), nanosec=int(round(frac * 1e9)) % 1_000_000_000)
    chosen = tuple(int(c) for c in channels)
    markers = [Marker(header=header, ns=NAMESPACE, action=Marker.DELETEALL)]
    if candidates is not None:
        for i, rows in enumerate(np.asarray(candidates, dtype=np.float64)):
            ok = True if valid is None else bool(valid[i])
            label = labels[i] if labels is not None else 0
            color = INVALID_COLOR if not ok or label < 0 else CLUSTER_COLORS[label % len(CLUSTER_COLORS)]
            markers.append(_strip(header, i, rows, chosen, CANDIDATE_WIDTH, color, lifetime))
    markers.append(_strip(header, SERVED_ID, np.asarray(trajectory, dtype=np.float64), chosen, SERVED_WIDTH,
                          SERVED_COLOR, lifetime))
    return MarkerArray(markers=markers)
