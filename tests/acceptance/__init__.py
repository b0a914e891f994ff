"""Acceptance: live training jobs and the statistical series (the lanes: tests/conftest.py)."""
