"""``trajectory-ensemble serve-openpi``: the engine on the OpenPI websocket wire, with no ROS needed.

Reads the node's params file with the node's own parameter table, so one file configures both faces; keys come from
``--api-key`` (repeatable) or :data:`API_KEY_ENV`, and a non-loopback bind without a key is refused unless
``--allow-remote-without-key``. On SIGINT or SIGTERM the process exits within :data:`EXIT_DEADLINE_S`. Usage:
docs/openpi.md.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import sys

from ..errors import ParameterError, TrajectoryEnsembleError, describe_error
from ..quoting import BoundedFormatter, quote_value
from ..serving import params as node_params
from ..serving.params_file import read_params_file
from ..serving.shutdown import arm_exit_deadline
from ..serving.startup_checks import bundled_settings_mismatch
from .policy import OpenPIPolicy
from .server import ROUTES, OpenPIServer, ServerLimits

API_KEY_ENV = "TRAJECTORY_ENSEMBLE_API_KEY"
"""Environment variable holding the key when ``--api-key`` is not given."""
EXIT_DEADLINE_S = 5.0
"""After SIGINT/SIGTERM the process is gone within this many seconds, graceful or not."""

logger = logging.getLogger("trajectory_ensemble.openpi")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve-openpi`` flags."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this host only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000, openpi's; 0 = any free port)")
    parser.add_argument("--params-file", default=None,
                        help="the node's YAML (e.g. config/serve.yaml): model, reducers, limits and openpi_* settings")
    parser.add_argument("--api-key", action="append", default=None,
                        help=f"key a client must send (Authorization: Api-Key or Bearer); repeat for several keys, "
                             f"each its own owner of sessions (docs/security.md); default ${API_KEY_ENV}")
    parser.add_argument("--allow-remote-without-key", action="store_true",
                        help="allow a non-loopback --host without a key (anyone who can reach it can use the model)")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name could resolve anywhere


def check_bind(host: str, api_key: str | list[str] | None, allow_remote_without_key: bool) -> None:
    """Refuse to serve an open model on the network by accident.

    Raises:
        ParameterError: ``host`` is not loopback, no key is set, and the operator did not allow it.
    """
    if api_key or is_loopback(host) or allow_remote_without_key:
        return
    raise ParameterError(f"invalid parameters:\n  --host {quote_value(host)} accepts connections from other machines "
                         "but no key "
                         f"is set; give --api-key (or ${API_KEY_ENV}), bind 127.0.0.1, or pass "
                         "--allow-remote-without-key")


def load_params(params_file: str | None) -> node_params.NodeParams:
    """The node's parameters from ``params_file`` (the node's defaults without one).

    Raises:
        ParameterError: the file or a value in it is invalid (every problem named).
    """
    raw = read_params_file(params_file) if params_file else {}
    return node_params.validate(raw)


def ready_line(server: OpenPIServer, port: int) -> str:
    """The line ``serve-openpi`` (and ``serve-ray``) logs once connections are accepted: ``[weights] ready:
    ws://HOST:PORT (routes ...), schema, chunk, candidates, reducer, auth, max_concurrent``."""
    policy = server.policy
    p = policy.params
    auth = f"on ({len(server.keys)} key{'s' if len(server.keys) > 1 else ''})" if server.keys else "off"
    return (f"[{policy.notice}] ready: ws://{server.host}:{port} (routes {list(ROUTES)}), schema {policy.schema.name}, "
            f"{p.domain_name} chunk {p.chunk_size} x {p.action_dim}, {p.candidate_count}x {p.reducer}, auth {auth}, "
            f"max_concurrent {server.limits.max_concurrent}")


async def _serve(server: OpenPIServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: (stop.set(), arm_exit_deadline(EXIT_DEADLINE_S, "serve-openpi")))

    def ready(port: int) -> None:
        logger.info("%s", ready_line(server, port))

    await server.run(stop, on_ready=ready)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM.

    Returns:
        `int`: 0 after a signal, 2 when the parameters, the bind or the model are invalid (the error is printed).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(BoundedFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    keys = [k for k in (args.api_key or [os.environ.get(API_KEY_ENV) or ""]) if k]
    api_key = keys or None
    try:
        check_bind(args.host, api_key, args.allow_remote_without_key)
        params = load_params(args.params_file)
        mismatch = bundled_settings_mismatch(params)
        if mismatch:
            logger.warning("%s", mismatch)
        policy = OpenPIPolicy.from_params(params)
    except TrajectoryEnsembleError as error:
        print(f"[serve-openpi] error: {describe_error(error)}", file=sys.stderr, flush=True)
        return 2
    server = OpenPIServer(policy, ServerLimits.from_params(params), host=args.host, port=args.port, api_key=api_key)
    policy.start()
    try:
        asyncio.run(_serve(server))
    except OSError as error:  # the port is taken, or the address is not this host's
        refusal = ParameterError(f"cannot listen on {args.host}:{args.port}: {error}")
        print(f"[serve-openpi] error: {describe_error(refusal)}", file=sys.stderr, flush=True)
        return 2
    finally:
        policy.stop(1.0)
    return 0
