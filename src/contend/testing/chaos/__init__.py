"""contend's own chaos suite: real expert processes, real signals, real servers started by the
suite, and faults injected from outside, with the same checks after every scenario.

The parts:

* :mod:`~contend.testing.chaos.workload` — the task type the experts run, whose every step
  writes a timestamped side effect, and the zombie writes of stopped runs;
* :mod:`~contend.testing.chaos.procs` — ``contend expert`` and ``contend submit`` processes;
* :mod:`~contend.testing.chaos.servers` — an SQLite file, a throwaway PostgreSQL cluster, a
  throwaway etcd;
* :mod:`~contend.testing.chaos.netns` — a network namespace and the faults on its link;
* :mod:`~contend.testing.chaos.scenario` — one run: its store, experts, tasks and faults;
* :mod:`~contend.testing.chaos.effects` and :mod:`~contend.testing.chaos.verdict` — what the
  side-effect logs and the store show, and the checks;
* one module per fault family: ``kills``, ``store``, ``network``, ``sqlite``, ``clock``,
  ``load``;
* :mod:`~contend.testing.chaos.runner` — ``python -m contend.testing.chaos`` (``make chaos``)
  and its short mode, and :mod:`~contend.testing.chaos.report` for docs/reliability.md.
"""
