"""ament_python entry point for colcon; pip reads the metadata from pyproject.toml.

Only ``data_files`` is given here: it is the one thing ament_python needs that PEP 621 cannot express
(the package index marker, the manifest, launch and config files under ``share/<package>``).
"""

from __future__ import annotations

import glob
import os
from typing import Any

from setuptools import setup
from setuptools.dist import Distribution

PACKAGE_NAME = "trajectory_ensemble"
HERE = os.path.dirname(os.path.abspath(__file__))


def _rel_glob(pattern: str) -> list[str]:
    """Return matches of ``pattern`` relative to this file's folder (setuptools wants relative paths)."""
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern)))


class _LiteralSafeDistribution(Distribution):
    """A Distribution whose configured options all have a ``repr`` that ``ast.literal_eval`` accepts.

    colcon learns an ament_python package's options by printing ``repr()`` of the configured
    Distribution and parsing it back with ``ast.literal_eval``. setuptools turns pyproject's
    ``requires-python`` into a ``packaging`` ``SpecifierSet``, whose repr is not a literal, so
    ``colcon build`` fails with "invalid syntax". Keeping it as the equivalent string changes nothing
    for setuptools, which accepts a string there too.
    """

    def parse_config_files(self, *args: Any, **kwargs: Any) -> None:
        """Read setup.cfg and pyproject.toml, then store ``python_requires`` as a plain string."""
        super().parse_config_files(*args, **kwargs)
        for holder in (self, self.metadata):
            value = getattr(holder, "python_requires", None)
            if value is not None and not isinstance(value, str):
                holder.python_requires = str(value)


setup(
    distclass=_LiteralSafeDistribution,
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + PACKAGE_NAME]),
        ("share/" + PACKAGE_NAME, ["package.xml"]),
        ("share/" + PACKAGE_NAME + "/launch", _rel_glob("launch/*.launch.py")),
        ("share/" + PACKAGE_NAME + "/config", _rel_glob("config/*.yaml")),
    ],
)
