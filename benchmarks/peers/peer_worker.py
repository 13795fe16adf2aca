"""``python -m benchmarks.peers.peer_worker PEER TARGET``: one peer worker process (see
:mod:`benchmarks.peers.peer_systems`). A module of its own, so that the task modules are
imported under their own names, not as ``__main__`` (Huey and Procrastinate key their task
registries by module)."""

from benchmarks.peers.peer_systems import main

if __name__ == "__main__":
    raise SystemExit(main())
