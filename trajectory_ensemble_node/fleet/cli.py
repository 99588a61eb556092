"""``trajectory-ensemble serve-ray``: the OpenPI wire in front of engine replicas on Ray Serve.

Every ``serve-openpi`` flag, plus ``--replicas``, ``--autoscale MIN,MAX`` and ``--ray-address``; SIGINT or SIGTERM
deletes the application. Usage: docs/scaling.md. Needs the optional extra: ``pip install '.[fleet]'``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from ..errors import TrajectoryEnsembleError, describe_error
from ..openpi import cli as openpi_cli
from ..quoting import BoundedFormatter
from ..serving.params_file import read_params_file

logger = logging.getLogger("trajectory_ensemble.fleet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``serve-openpi``'s flags and the fleet's."""
    openpi_cli.add_arguments(parser)
    parser.add_argument("--replicas", type=int, default=1, help="engine replicas, each one model (default 1)")
    parser.add_argument("--autoscale", default=None, metavar="MIN,MAX",
                        help="scale replicas between MIN and MAX on ongoing requests (instead of --replicas)")
    parser.add_argument("--ray-address", default=None,
                        help="a running Ray cluster (e.g. 'auto'); default: start a local instance on this machine")
    parser.add_argument("--app-name", default="trajectory_ensemble", help="the Serve application's name")


def _fail(error: TrajectoryEnsembleError) -> int:
    print(f"[serve-ray] error: {describe_error(error)}", file=sys.stderr, flush=True)
    return 2


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM.

    Returns:
        `int`: 0 after a signal; 2 when the parameters, the bind, Ray or the replicas are unusable (printed).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(BoundedFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    from .app import application, parse_autoscale

    keys = [k for k in (args.api_key or [os.environ.get(openpi_cli.API_KEY_ENV) or ""]) if k]
    try:
        openpi_cli.check_bind(args.host, keys or None, args.allow_remote_without_key)
        raw = read_params_file(args.params_file) if args.params_file else {}
        autoscale = parse_autoscale(args.autoscale)
        app = application(raw, replicas=args.replicas, autoscale=autoscale, host=args.host, port=args.port,
                          api_keys=keys)
    except TrajectoryEnsembleError as error:
        return _fail(error)
    import ray
    from ray import serve

    started = args.ray_address is None
    ray.init(address=args.ray_address, include_dashboard=False,
             **({"num_cpus": os.cpu_count()} if started else {}))
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve.start(proxy_location="Disabled")
        try:
            ingress = serve.run(app, name=args.app_name, route_prefix=None, blocking=False)
            logger.info("%s", ingress.ready_line.remote().result())
        except Exception as error:  # noqa: BLE001 - Serve reports a replica that failed to start as RuntimeError
            print(f"[serve-ray] error: the application did not start: {type(error).__name__}: "
                  f"{str(error).splitlines()[0] if str(error) else ''}", file=sys.stderr, flush=True)
            return 2
        stop.wait()
        logger.info("serve-ray: stopping")
    finally:
        try:
            serve.delete(args.app_name)
        finally:
            if started:
                serve.shutdown()
                ray.shutdown()
    return 0
