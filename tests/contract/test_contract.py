"""Collects the contract suite; the backends are registered in ``backends.py``."""

from contend.testing.contract.competition import *  # noqa: F403
from contend.testing.contract.history import *  # noqa: F403
from contend.testing.contract.stateful import test_store_state_machine  # noqa: F401
from contend.testing.contract.store import *  # noqa: F403
