"""The reducer registry: the built-in tables of :mod:`.basic` and :mod:`.continuity`, and what callers register.

The built-in reducers are listed in their modules' ``BUILTIN`` tables and collected here; no module registers itself
as a side effect of being imported.
"""

from __future__ import annotations

import dataclasses
import functools

from ..errors import InvalidSpecError, UnknownReducerError
from ..quoting import quote_value
from . import basic, continuity
from .types import Reducer

_REGISTRY: dict[str, Reducer] = {r.name: r for r in (*basic.BUILTIN, *continuity.BUILTIN)}
"""Built in from the two tables, in this order; :func:`register_reducer` adds more."""

_CLUSTERING = {"mode": basic.mode_reduce, "mode_continuity": continuity.mode_continuity_reduce}
CLUSTERING_REDUCERS = tuple(_CLUSTERING)
"""The built-in reducers that cluster with :func:`~.basic.mode_clusters`, so a fixed ``mode_threshold`` applies."""


def register_reducer(reducer: Reducer, *, replace: bool = False) -> Reducer:
    """Add a reducer to the registry so requests can name it.

    Args:
        reducer (`Reducer`): The reducer to add.
        replace (`bool`, defaults to `False`): Allow replacing a reducer of the same name.

    Returns:
        `Reducer`: ``reducer``, so this can be used inline.

    Raises:
        InvalidSpecError: If ``reducer`` is not a :class:`Reducer`, or the name is taken and ``replace`` is False.
    """
    if not isinstance(reducer, Reducer):
        raise InvalidSpecError(f"register_reducer expects a Reducer, got {quote_value(reducer)}")
    if reducer.name in _REGISTRY and not replace:
        raise InvalidSpecError(f"reducer {quote_value(reducer.name)} is already registered; pass replace=True to replace it")
    _REGISTRY[reducer.name] = reducer
    return reducer


def get_reducer(name: str) -> Reducer:
    """Look a reducer up by name.

    Args:
        name (`str`): A registered name.

    Returns:
        `Reducer`: The registered reducer.

    Raises:
        UnknownReducerError: If ``name`` is not registered; the message lists the known names.
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownReducerError(
            f"unknown reducer {quote_value(name)}; registered reducers: {', '.join(available_reducers())}"
        ) from None


def available_reducers() -> tuple[str, ...]:
    """Names of all registered reducers, sorted."""
    return tuple(sorted(_REGISTRY))


def configured_reducer(name: str, mode_threshold: float | None = None) -> Reducer:
    """The reducer a served request uses: :func:`get_reducer`, with a fixed ``mode_threshold`` bound into the
    built-in clustering reducers (``mode``, ``mode_continuity``).

    ``None`` (the default) leaves every reducer as registered (``mode`` on its relative rule). A reducer registered
    under one of those names by a caller (``replace=True``) is returned as registered: its rule is its own.

    Args:
        name (`str`): A registered name.
        mode_threshold (`float`, *optional*): A fixed cut, RMS in the space the reducer runs in, ``>= 0``
            (:func:`~.basic.check_mode_threshold`).

    Returns:
        `Reducer`: The registered reducer, or a copy whose ``fn`` has ``threshold=mode_threshold`` bound.

    Raises:
        UnknownReducerError: ``name`` is not registered.
        InvalidSpecError: ``mode_threshold`` is neither ``None`` nor a finite number ``>= 0``.
    """
    reducer = get_reducer(name)
    threshold = basic.check_mode_threshold(mode_threshold)
    fn = _CLUSTERING.get(name)
    if threshold is None or fn is None or reducer.fn is not fn:
        return reducer
    return dataclasses.replace(reducer, fn=functools.partial(fn, threshold=threshold),
                               description=f"{reducer.description} (fixed threshold {threshold:g})")
