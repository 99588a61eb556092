"""The one factory of the served model: parameters in, a :class:`Cosmos3ActionModel` out, the same for every face.

The node (:class:`~trajectory_ensemble_node.ros.model_host.ModelHost`), the OpenPI server
(:meth:`~trajectory_ensemble_node.openpi.policy.OpenPIPolicy.from_params`) and the lab's fleet bench all build what
they serve here, so the loader, the 13 settings, the limits and the model-dependent checks cannot drift apart between
faces. Faces call it as ``model_factory.build_model(...)`` (not a copied name), so one patch reaches all of them. The
remote model (``remote.RemoteModel``, ``engine: openpi``) reads the same files by :func:`served_files`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..bundled import mode_threshold
from ..catalog import load_pipeline
from ..contract import check_reducer
from ..errors import InvalidSpecError, ParameterError
from ..models.cosmos3 import Cosmos3ActionModel
from ..normalization import ActionNormalizer
from ..safety import ActionLimits, load_limits
from .faults import FaultInjector
from .params import TESTING_ENV, NodeParams
from .request_path import ServedModel
from .startup_checks import load_action_stats, load_novelty, load_uncertainty_threshold


def served_files(params: NodeParams
                 ) -> tuple[ActionLimits | None, ActionNormalizer | None, float | None, float | None]:
    """What the configured files and settings give a served model, local or remote, read in this order.

    Returns:
        `tuple`: the limits (checked against the action width), the action statistics, the uncertainty threshold and
        the fixed ``mode`` cut (``None``: the relative rule).

    Raises:
        StatsFileError, LimitsFileError: a configured file is unusable (limits of the wrong width included).
    """
    p = params
    limits = load_limits(p.limits_file) if p.limits_file else None
    if limits is not None:
        limits.check_width(p.action_dim)
    return limits, load_action_stats(p), load_uncertainty_threshold(p), mode_threshold(p)


def build_model(params: NodeParams, *, on_loaded: Callable[[], None] = lambda: None) -> Cosmos3ActionModel:
    """The model ``params`` configure: load the pipeline, read the limits, stats and calibration files, check the
    reducer against the model. The engine is not started.

    Args:
        params (`NodeParams`): The validated parameters.
        on_loaded (`Callable[[], None]`): Called once the pipeline is loaded, before any configured file is read
            (the node logs its settings warnings there, as it always has).

    Returns:
        `Cosmos3ActionModel`: the service, engine not started; its notice is
        :func:`~trajectory_ensemble_node.catalog.model_notice` of ``params.model``.

    Raises:
        ModelLoadError, PickleWeightsError: the model cannot be loaded.
        StatsFileError, LimitsFileError, NoveltyScorerError: a configured file is unusable (limits of the wrong width
            included: refused at startup, not on the first request).
        ParameterError: the ``reducer`` parameter is not valid for this model.
    """
    p = params
    pipe, _ = load_pipeline(p.model, p.device, p.dtype, allow_pickle=p.allow_pickle_weights, seed=p.seed)
    on_loaded()
    limits, action_stats, uncertainty_threshold, mode_cut = served_files(p)
    model = Cosmos3ActionModel(
        pipe, max_batch_candidates=p.max_batch_candidates, max_candidates=p.max_candidates,
        prefix_retain=p.prefix_retain, cfg_mode=p.cfg_mode, step_capture=p.step_capture,
        action_stats=action_stats, limits=limits, min_valid_candidates=p.min_valid_candidates,
        position_policy=p.position_limit_policy, uncertainty_threshold=uncertainty_threshold,
        novelty=load_novelty(p), mode_threshold=mode_cut,
    )
    del pipe  # the model owns it now; a cleanup must leave no other reference behind
    try:
        check_reducer(p.reducer, p.action_dim, valid_reducers=model.valid_reducers(), domain_name=p.domain_name)
    except InvalidSpecError as error:
        raise ParameterError(f"invalid parameters:\n  reducer: {error}") from None
    return model


def fault_hook(model: ServedModel) -> FaultInjector | None:
    """TEST ONLY: wrap the model's adapter in a :class:`FaultInjector` in a test run
    (``TRAJECTORY_ENSEMBLE_TESTING=1``), else nothing: production never carries the hook.

    Args:
        model (`ServedModel`): The served model (:meth:`instrument`).

    Returns:
        `FaultInjector` or `None`: the injector, in a test run where the model's adapter runs in this process.
    """
    return model.instrument(FaultInjector) if os.environ.get(TESTING_ENV) == "1" else None
