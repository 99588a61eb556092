"""The Serve application: the OpenPI ingress in front of ``R`` engine replicas.

``serve run config/serve_ray.yaml`` (or ``trajectory_ensemble_node.fleet.app:build_app``). The ingress runs
``serve-openpi``'s own server with a :class:`.backend.RayBackend`; sessions and validation stay there, model work goes
to the :class:`.replica.EngineReplica` s. Replica limits and autoscaling: docs/scaling.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from ..catalog import model_notice
from ..errors import ParameterError
from ..openpi.cli import API_KEY_ENV, check_bind, ready_line
from ..openpi.policy import OpenPIPolicy
from ..openpi.server import OpenPIServer, ServerLimits, ServerThread
from ..serving import model_factory
from ..serving import params as node_params
from ..serving.params_file import read_params_file
from ..wire.schemas import get_schema
from .backend import RayBackend
from .replica import EngineReplica

REPLICA_CPUS = 1.0
"""Logical CPUs a replica reserves (a CPU replica's torch threads; a GPU replica's host work)."""


def parse_autoscale(text: str | None) -> tuple[int, int] | None:
    """``"MIN,MAX"`` replicas for autoscaling, or ``None``.

    Raises:
        ParameterError: not two integers ``1 <= MIN <= MAX`` (the text is quoted).
    """
    if not text:
        return None
    try:
        low, high = (int(part) for part in str(text).split(","))
    except ValueError:
        raise ParameterError(f"invalid parameters:\n  --autoscale must be MIN,MAX replicas, got {text!r}") from None
    if not 1 <= low <= high:
        raise ParameterError(f"invalid parameters:\n  --autoscale needs 1 <= MIN <= MAX, got {text!r}")
    return low, high


class FleetServer(OpenPIServer):
    """``serve-openpi``'s server, its ``/stats`` ``groups`` counted at the ingress (:meth:`RayBackend.outcome_counts`)
    instead of by the ingress's own engine, which never runs a group."""

    def stats(self) -> dict[str, Any]:
        stats = super().stats()
        backend = self.policy.backend
        if isinstance(backend, RayBackend):
            stats["groups"] = backend.outcome_counts()
        return stats


class Ingress:
    """The OpenPI wire in front of the engine deployment (one Serve replica, its server on its own thread).

    Args:
        engine (`Any`): The engine deployment's ``DeploymentHandle``.
        raw_params (`dict[str, Any]`): The node's parameters as read from the params file.
        host (`str`), port (`int`): Where the wire listens (``port=0``: a free port, see :meth:`ready_line`).
        api_keys (`Sequence[str]`, *optional*): The keys; ``None`` reads ``api_key_env`` here.
        api_key_env (`str`): The environment variable holding the key when ``api_keys`` is ``None``.
        replicas (`int`): Most engine replicas (the ingress admits ``openpi_max_concurrent`` requests per replica).
    """

    def __init__(self, engine: Any, raw_params: dict[str, Any], host: str = "127.0.0.1", port: int = 8000,
                 api_keys: Sequence[str] | None = None, api_key_env: str = API_KEY_ENV, replicas: int = 1) -> None:
        params = node_params.validate(raw_params)
        keys = list(api_keys) if api_keys is not None else [k for k in [os.environ.get(api_key_env) or ""] if k]
        check_bind(host, keys or None, False)
        # The ingress needs the model only for its tokenizer, checks and metadata; its engine never starts. On the
        # CPU it takes no GPU memory that Ray reserved for a replica (the ingress reserves none).
        model = model_factory.build_model(dataclasses.replace(params, device="cpu"))
        policy = OpenPIPolicy(model, params, notice=model_notice(params.model), schema=get_schema(params.openpi_schema),
                              backend=RayBackend(engine))
        limits = ServerLimits.from_params(params)
        limits = dataclasses.replace(limits, max_concurrent=limits.max_concurrent * max(int(replicas), 1))
        self.server = FleetServer(policy, limits, host=host, port=port, api_key=keys or None)
        self.thread = ServerThread(self.server).start()

    def ready_line(self) -> str:
        """``serve-openpi``'s ready line, for the bound port."""
        assert self.thread.port is not None
        return ready_line(self.server, self.thread.port)

    def stats(self) -> dict[str, Any]:
        """The server's counts (as ``GET /stats``)."""
        return self.server.stats()

    def check_health(self) -> None:
        """Ray Serve's health check.

        Raises:
            RuntimeError: the wire's server thread is gone.
        """
        if not self.thread._thread.is_alive():
            raise RuntimeError("the OpenPI server thread is not running")

    def __del__(self) -> None:
        thread = getattr(self, "thread", None)
        if thread is not None:
            thread.stop(2.0)


def application(raw_params: dict[str, Any], *, replicas: int = 1, autoscale: tuple[int, int] | None = None,
                host: str = "127.0.0.1", port: int = 8000, api_keys: Sequence[str] | None = None,
                api_key_env: str = API_KEY_ENV) -> Any:
    """The bound Serve application: :class:`Ingress` in front of the engine replicas.

    Args:
        raw_params (`dict[str, Any]`): The node's parameters (validated here first: a bad file is refused before any
            actor starts).
        replicas (`int`): Engine replicas (ignored with ``autoscale``).
        autoscale (`tuple[int, int]`, *optional*): Min and max replicas, scaled on ongoing requests.
        host (`str`), port (`int`), api_keys (`Sequence[str]`), api_key_env (`str`): As :class:`Ingress`.

    Raises:
        ParameterError: a parameter is invalid, or ``replicas < 1``.
    """
    from ray import serve

    params = node_params.validate(raw_params)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ParameterError(f"invalid parameters:\n  replicas must be an int >= 1, got {replicas!r}")
    per_replica = params.openpi_max_concurrent
    actor = {"num_cpus": REPLICA_CPUS, "num_gpus": 1 if str(params.device).startswith("cuda") else 0}
    scaling: dict[str, Any] = {"num_replicas": replicas}
    if autoscale is not None:
        scaling = {"autoscaling_config": {"min_replicas": autoscale[0], "max_replicas": autoscale[1],
                                          "target_ongoing_requests": max(per_replica // 2, 1)}}
    engine = serve.deployment(EngineReplica, name="EngineReplica", max_ongoing_requests=per_replica,
                              ray_actor_options=actor, health_check_period_s=2.0, **scaling)
    # The ingress waits on the network, not the CPU: it reserves none, so R replicas fit R logical CPUs.
    ingress = serve.deployment(Ingress, name="OpenPIIngress", num_replicas=1, ray_actor_options={"num_cpus": 0})
    most = autoscale[1] if autoscale is not None else replicas
    return ingress.bind(engine.bind(raw_params), raw_params, host, port, api_keys, api_key_env, most)


def build_app(args: dict[str, Any]) -> Any:
    """``serve run trajectory_ensemble_node.fleet.app:build_app`` (or a YAML's ``import_path``).

    Args:
        args (`dict[str, Any]`): ``params_file`` (the node's YAML; the defaults without one), ``replicas`` (1),
            ``autoscale`` (``"MIN,MAX"``), ``host`` (127.0.0.1), ``port`` (8000), ``api_key_env`` (the
            environment variable holding the key, read in the ingress's process; a key is never in a params file).
    """
    params_file = args.get("params_file")
    raw = read_params_file(params_file) if params_file else {}
    return application(raw, replicas=int(args.get("replicas", 1)), autoscale=parse_autoscale(args.get("autoscale")),
                       host=str(args.get("host", "127.0.0.1")), port=int(args.get("port", 8000)), api_keys=None,
                       api_key_env=str(args.get("api_key_env", API_KEY_ENV)))
