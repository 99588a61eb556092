"""A bounded exit: after SIGINT/SIGTERM the process is gone within a deadline, graceful or not (ROS-free).

Both faces of the service use it: the node (``ros/serve.py``, every goal ends SHUTDOWN first) and the OpenPI server
(``openpi/cli.py``, every request gets a SHUTDOWN frame first). If the graceful path is still running
:data:`SHUTDOWN_DEADLINE_S` later, wherever it is stuck (a long encode on the engine thread, a DDS call), the
process exits hard with :data:`FORCED_EXIT_CODE`.
"""

from __future__ import annotations

import os
import sys
import threading
import time

SHUTDOWN_DEADLINE_S = 4.0
"""After SIGINT/SIGTERM the process is gone within this many seconds, graceful or not."""
FORCED_EXIT_CODE = 3
"""Exit status when the graceful shutdown did not finish within :data:`SHUTDOWN_DEADLINE_S`."""

_deadline_lock = threading.Lock()
_deadline_armed = False


def arm_exit_deadline(deadline_s: float = SHUTDOWN_DEADLINE_S, name: str = "trajectory_ensemble") -> None:
    """Start (once) a watchdog that ends the process ``deadline_s`` from now if it has not exited by then.

    Args:
        deadline_s (`float`): Seconds the graceful shutdown may take.
        name (`str`): Names the process in the line it writes when the deadline passes.
    """
    global _deadline_armed
    with _deadline_lock:
        if _deadline_armed:
            return
        _deadline_armed = True

    def watchdog() -> None:
        time.sleep(deadline_s)
        # os.write, not print: the interpreter may be mid-shutdown, and this line must still reach the log.
        os.write(sys.stderr.fileno(), (f"[{name}] graceful shutdown took more than {deadline_s:g} s; "
                                       f"exiting now ({FORCED_EXIT_CODE})\n").encode())
        os._exit(FORCED_EXIT_CODE)

    threading.Thread(target=watchdog, name="exit-deadline", daemon=True).start()


def exit_now(code: int) -> None:
    """End the process at once after a signal-driven shutdown, skipping the interpreter's teardown.

    By then every goal has ended, the executor, the node and the rclpy context are shut down explicitly. What is
    left is interpreter finalization, where C-level teardown (DDS participants, torch) took 4-5 s on a loaded
    2-core machine, with daemon threads (the exit watchdog) already frozen, so a SIGINT could exceed the bound.

    Args:
        code (`int`): The exit status.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing left to flush into it
    os._exit(code)
