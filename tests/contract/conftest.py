"""The contract suite (``contend.testing.contract``) on this project's four backends."""

from contend.testing.contract.plugin import harness, pytest_generate_tests
from tests.contract import backends

__all__ = ["backends", "harness", "pytest_generate_tests"]
