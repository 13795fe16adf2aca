"""The public API is curated: everything in ``contend.__all__`` exists, nothing private leaks."""

from __future__ import annotations

import contend


def test_all_names_exist_and_are_public() -> None:
    for name in contend.__all__:
        assert hasattr(contend, name), name
        assert not name.startswith("_") or name == "__version__"


def test_nothing_else_public_leaks() -> None:
    public = {n for n in vars(contend) if not n.startswith("_")}
    modules = {
        "domain",
        "errors",
        "runtime",
        "store",
        "testing",
        "cli",
        "demo",
        "sim",
        "metrics",
        "dashboard",
        "gossip",
    }
    assert public - set(contend.__all__) - modules == set()


def test_every_error_derives_from_the_root() -> None:
    errors = [
        getattr(contend, n) for n in contend.__all__ if n.endswith(("Error", "Failed", "Lost"))
    ]
    errors += [
        contend.FencedOut,
        contend.ExpertConflict,
        contend.UnknownTaskType,
        contend.TaskNotFound,
        contend.TransactionConflict,
    ]
    for cls in errors:
        assert issubclass(cls, contend.ContendError), cls
