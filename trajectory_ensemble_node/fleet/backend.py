"""The ingress's backend: each built group goes to an engine replica, and a ``GroupHandle`` ends with its reply.

:class:`RayBackend` is the ``Backend`` of ``serve-ray``'s ingress: everything of ``serve-openpi`` stays, only the engine
is elsewhere. Canceling the handle cancels the Serve request and so the group; a replica that dies with the group in
it ends it with :class:`~trajectory_ensemble_node.errors.ReplicaLostError` (``REPLICA_LOST``, 95; docs/scaling.md).
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

from ..engine import GroupHandle, GroupRequest
from ..engine.status import GroupStatus
from ..errors import AbortReason, GroupCanceledError, ReplicaLostError
from ..openpi.policy import Job
from .protocol import describe, error_from_payload, result_from_payload

logger = logging.getLogger("trajectory_ensemble.fleet")


def _lost_replica_errors() -> tuple[type[BaseException], ...]:
    """Ray's ways of saying the replica that held a request is gone (imported lazily: only the fleet needs ray)."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
    from ray.serve.exceptions import DeploymentUnavailableError

    return ActorDiedError, ActorUnavailableError, RayActorError, DeploymentUnavailableError


class RemoteGroupHandle(GroupHandle):
    """A :class:`GroupHandle` whose group runs on a replica.

    Args:
        request (`GroupRequest`): The ingress's request (its group and spec rebuild the result).
        response (`Any`): The Serve ``DeploymentResponse`` of its description.
    """

    def __init__(self, request: GroupRequest, response: Any) -> None:
        super().__init__(request)
        self._response = response
        self.replica_lost = False
        self._mark(GroupStatus.RUNNING)

    def cancel(self, reason: AbortReason = AbortReason.CANCELED, message: str = "") -> bool:
        """Cancel the Serve request; the replica stops the group at its next step (see :meth:`GroupHandle.cancel`)."""
        if not super().cancel(reason, message):
            return False
        self._response.cancel()
        return True

    def wait_reply(self) -> None:
        """Block until the replica replies, then end the handle (run on its own thread)."""
        from ray.serve.exceptions import RequestCancelledError

        request_id = self.request_id
        try:
            payload = self._response.result()
        except RequestCancelledError:
            self._finish(None, self.cancel_requested or GroupCanceledError(request_id, f"group {request_id} canceled"))
            return
        except _lost_replica_errors() as error:
            logger.warning("fleet: %s: the replica serving it was lost (%s)", request_id, type(error).__name__)
            self.replica_lost = True
            self._finish(None, ReplicaLostError(request_id, f"the engine replica serving request {request_id} died "
                                                            "before it replied; nothing was published"))
            return
        except Exception as error:  # noqa: BLE001 - reported as the wire's InternalError frame, never a traceback
            logger.error("fleet: %s: the replica call failed: %s", request_id, type(error).__name__)
            self._finish(None, RuntimeError("the replica call failed"))
            return
        if self.cancel_requested is not None:
            self._finish(None, self.cancel_requested)
        elif "error" in payload:
            self._finish(None, error_from_payload(payload, request_id))
        else:
            self._finish(result_from_payload(self.request, payload), None)


class RayBackend:
    """Forward built groups to a Ray Serve deployment of :class:`.replica.EngineReplica`.

    Args:
        handle (`Any`): The engine deployment's ``DeploymentHandle``.
    """

    encodes_ahead = False  # the replica encodes: conditioning tensors stay where the model runs

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._outcomes: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def outcome_counts(self) -> dict[str, int]:
        """How the groups sent to the replicas ended, counted as the engine's ``outcome_counts()`` counts them
        (``succeeded``, ``canceled``, ``preempted``, ``shutdown``, ``failed``), plus ``replica_lost`` (also
        ``failed``): the ingress's ``/stats`` ``groups``."""
        with self._lock:
            return dict(self._outcomes)

    def _count(self, handle: GroupHandle) -> None:
        with self._lock:
            self._outcomes[handle.status.service_counter] += 1
            if getattr(handle, "replica_lost", False):
                self._outcomes["replica_lost"] += 1

    def start(self) -> None:
        """Nothing to start: the replicas run their engines."""

    def stop(self, timeout: float) -> None:
        """Nothing to stop: Serve owns the replicas."""

    def submit(self, job: Job) -> GroupHandle:
        """Send the job's group to a replica; the handle ends with its reply."""
        assert job.request is not None, "build() first"
        handle = RemoteGroupHandle(job.request, self.handle.remote(describe(job)))
        handle.add_done_callback(self._count)
        threading.Thread(target=handle.wait_reply, name=f"fleet-{job.request_id}", daemon=True).start()
        return handle
