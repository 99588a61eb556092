"""Fixtures of the OpenPI tests (defined in ``_openpi_harness.py``, the one home of their helpers)."""

from _openpi_harness import paced, toy_policy  # noqa: F401 - fixtures
