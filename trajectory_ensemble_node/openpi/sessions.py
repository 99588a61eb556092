"""Sessions: the closed loop over the wire, with the node's own continuity machinery.

Each session (a request's ``session_id``, or the connection's own session when it names none) has one
:class:`~trajectory_ensemble_node.ros.continuity.ChunkMemory`, the same object the node keeps for its one robot: the
last chunk served, in the model's space, its stamp, ``dt``, instruction and weights version, and the latency estimate.
A request with ``continue_previous`` is decided by :meth:`ChunkMemory.decide` exactly as a goal is (same drop rules,
same ``continuity`` status strings) and runs with the :class:`~trajectory_ensemble_node.engine.context.ExecutionContext`
it returns; every served chunk is remembered. Alignment is by the request's ``stamp`` (seconds on the client's clock)
or, when it has none, by its arrival time on this host's monotonic clock: a session should use one or the other.

``{"endpoint": "reset"}`` drops a session's chunk. Sessions are kept least recently used first, at most
:data:`MAX_SESSIONS`, so clients that never reset cannot grow the server's memory.
"""

from __future__ import annotations

import collections
import threading

from ..contract import EnsembleResult
from ..engine.validity import to_model_space
from ..normalization import ActionNormalizer
from ..ros.continuity import ChunkMemory, ContinuityDecision, ServedChunk
from ..ros.goals import GoalPlan

MAX_SESSIONS = 1024
"""Sessions remembered at once; the least recently used one is forgotten first."""


class SessionStore:
    """One :class:`ChunkMemory` per session key, least recently used out. Thread-safe.

    Args:
        max_sessions (`int`): Most sessions kept.
    """

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = int(max_sessions)
        self._lock = threading.Lock()
        self._memories: collections.OrderedDict[str, ChunkMemory] = collections.OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._memories)

    def memory(self, key: str) -> ChunkMemory:
        """The session's memory (a new, empty one the first time)."""
        with self._lock:
            memory = self._memories.get(key)
            if memory is None:
                memory = self._memories[key] = ChunkMemory()
                while len(self._memories) > self.max_sessions:
                    self._memories.popitem(last=False)
            self._memories.move_to_end(key)
            return memory

    def reset(self, key: str) -> bool:
        """Forget the session's chunk; True when it had one."""
        with self._lock:
            memory = self._memories.get(key)
        return memory.drop() if memory is not None else False

    def forget(self, key: str) -> None:
        """Drop the session altogether (a connection's own session, when the connection closes)."""
        with self._lock:
            self._memories.pop(key, None)


def decide(memory: ChunkMemory, plan: GoalPlan, stamp: float, weights_version: int) -> ContinuityDecision:
    """How a request relates to its session's last chunk (what the node does for a goal).

    Raises:
        DelayTooLongError: the request's ``inference_delay`` runs past what is left of the previous chunk.
    """
    return memory.decide(continue_previous=plan.continue_previous, reset=plan.reset_context,
                         inference_delay=plan.inference_delay, guidance=plan.guidance, stamp=stamp,
                         instruction=plan.instruction, weights_version=weights_version)


def remember(memory: ChunkMemory, result: EnsembleResult, plan: GoalPlan, *, stamp: float, dt: float,
             normalizer: ActionNormalizer | None, latency_s: float) -> float | None:
    """Remember a served chunk (in the model's space, as the node does) and fold in its latency.

    Args:
        memory (`ChunkMemory`): The session's memory.
        result (`EnsembleResult`): What was served.
        plan (`GoalPlan`): Its plan (instruction).
        stamp (`float`): The request's stamp (seconds).
        dt (`float`): Seconds between actions.
        normalizer (`ActionNormalizer`, *optional*): The configured action statistics (``None`` = normalized).
        latency_s (`float`): Arrival to result, seconds.

    Returns:
        `float | None`: the session's latency estimate in seconds.
    """
    action = result.action if normalizer is None else to_model_space(result.action, normalizer)
    memory.remember(ServedChunk(action.float(), stamp, dt, plan.instruction,
                                int(result.metrics.get("weights_version") or 0)))
    memory.observe_latency(latency_s)
    return memory.estimator.estimate
