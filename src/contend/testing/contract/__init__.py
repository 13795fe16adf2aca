"""The store contract suite: the tests every backend must pass, importable by any project.

A backend outside this repository runs it as this repository runs it on its own four
(River's ``riverdrivertest`` is the model). In the backend's test folder:

``conftest.py`` registers a harness and loads the suite's fixture::

    from contextlib import asynccontextmanager
    from contend.testing.contract import Harness, backend
    from contend.testing.contract.plugin import harness, pytest_generate_tests  # noqa: F401

    @backend("mystore")
    @asynccontextmanager
    async def my_harness(tmp_path):
        ...  # open a store on an empty target, on a fake clock
        yield Harness("mystore", store, advance, new_store)

``test_contract.py`` collects the tests::

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
    from contend.testing.contract.sessions import *  # noqa: F403
    from contend.testing.contract.stateful import test_store_state_machine  # noqa: F401
    from contend.testing.contract.submission import *  # noqa: F403
    from contend.testing.contract.transactions import *  # noqa: F403

Every test takes the ``harness`` fixture and runs once per registered backend. What a backend
cannot promise it declares in ``Harness.extra`` (see :class:`Harness`); a test that depends on
such a promise reads it there instead of assuming it. It needs ``pytest``, ``pytest-asyncio``
(``asyncio_mode = "auto"``) and ``hypothesis``: the ``dev`` extra.
"""

import pytest

# The suite's modules hold the asserts: let pytest explain a failed one as it does in tests.
pytest.register_assert_rewrite(
    "contend.testing.contract.central",
    "contend.testing.contract.claims",
    "contend.testing.contract.competition",
    "contend.testing.contract.dependencies",
    "contend.testing.contract.fencing",
    "contend.testing.contract.helpers",
    "contend.testing.contract.history",
    "contend.testing.contract.leases",
    "contend.testing.contract.limits",
    "contend.testing.contract.management",
    "contend.testing.contract.prefixes",
    "contend.testing.contract.sessions",
    "contend.testing.contract.stateful",
    "contend.testing.contract.submission",
    "contend.testing.contract.transactions",
)

from contend.testing.contract.harness import (  # noqa: E402
    BACKENDS,
    Backend,
    Factory,
    Harness,
    backend,
    backend_params,
)

__all__ = ["BACKENDS", "Backend", "Factory", "Harness", "backend", "backend_params"]
