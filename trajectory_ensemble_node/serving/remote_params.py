"""The checks of the remote-engine parameters (``engine``, ``engine_url``, ``engine_api_key_env``, ...).

Kept apart from :mod:`.params` (whose table declares them) so the table stays one readable file. The key itself is
never a parameter: ``engine_api_key_env`` names the environment variable that holds it, so a params file can be
shared without the secret.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

ENGINES = ("local", "openpi")
"""``local``: the model runs in this process; ``openpi``: a remote server speaking the OpenPI wire runs it."""
URL_SCHEMES = ("ws", "wss")


def check_engine(p: Mapping[str, Any], problems: list[str], env: Mapping[str, str] | None = None) -> None:
    """Append the problems of the remote-engine parameters to ``problems`` (each prefixed with its name).

    Args:
        p (`Mapping[str, Any]`): The coerced parameter values.
        problems (`list[str]`): Where problems go.
        env (`Mapping[str, str]`, *optional*): Environment the key is read from; defaults to ``os.environ``.
    """
    engine, url, key_env = p["engine"], p["engine_url"], p["engine_api_key_env"]
    if engine not in ENGINES:
        problems.append(f"engine: {engine!r} is not one of {list(ENGINES)}")
    if p["engine_timeout_s"] <= 0:
        problems.append(f"engine_timeout_s: must be > 0, got {p['engine_timeout_s']}")
    if p["openpi_samples_per_request"] < 0:
        problems.append(f"openpi_samples_per_request: must be >= 0 (0 = up to max_candidates), got "
                        f"{p['openpi_samples_per_request']}")
    if engine != "openpi":
        return
    try:
        parts = urlsplit(url)
        usable = parts.scheme in URL_SCHEMES and bool(parts.hostname)
        _ = parts.port  # a port that is no number raises here
    except ValueError:
        usable = False
    if p["enable_weight_updates"]:
        problems.append("enable_weight_updates: weights are updated on the remote server, not on a node with engine: "
                        "openpi")
    if not usable:
        problems.append(f"engine_url: {url!r} must be a ws://HOST:PORT or wss://HOST:PORT url when engine is openpi")
    if key_env:
        env = os.environ if env is None else env
        if not env.get(key_env):
            problems.append(f"engine_api_key_env: the environment variable {key_env!r} it names is unset or empty "
                            "(the key is read from the environment, never from a params file)")
