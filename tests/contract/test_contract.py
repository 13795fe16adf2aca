"""Collects the contract suite; the backends are registered in ``backends.py``."""

from contend.testing.contract.central import *  # noqa: F403
from contend.testing.contract.claims import *  # noqa: F403
from contend.testing.contract.competition import *  # noqa: F403
from contend.testing.contract.dependencies import *  # noqa: F403
from contend.testing.contract.fencing import *  # noqa: F403
from contend.testing.contract.history import *  # noqa: F403
from contend.testing.contract.leases import *  # noqa: F403
from contend.testing.contract.limits import *  # noqa: F403
from contend.testing.contract.management import *  # noqa: F403
from contend.testing.contract.prefixes import *  # noqa: F403
from contend.testing.contract.retention import *  # noqa: F403
from contend.testing.contract.sessions import *  # noqa: F403
from contend.testing.contract.stateful import test_store_state_machine  # noqa: F401
from contend.testing.contract.submission import *  # noqa: F403
from contend.testing.contract.transactions import *  # noqa: F403
