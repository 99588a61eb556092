"""The node's action server: rclpy's, telling the node when a cancel request has been fully processed."""

from __future__ import annotations

from typing import Any

from rclpy.action import ActionServer


class NotifyingActionServer(ActionServer):
    """rclpy's ``ActionServer``, telling the node when a cancel request has been fully processed.

    rclpy moves an accepted cancel's goal to CANCELING only after the cancel callback returns, and rcl refuses
    ``canceled()`` before that. The goal's thread, woken by the callback, waits for this moment on an event
    (:attr:`GoalRecord.cancel_processed`) instead of polling the goal's status.
    """

    def __init__(self, *args: Any, on_cancel_processed: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_cancel_processed = on_cancel_processed

    async def _execute_cancel_request(self, request_header_and_message: Any) -> None:
        try:
            await super()._execute_cancel_request(request_header_and_message)
        finally:
            self._on_cancel_processed()
