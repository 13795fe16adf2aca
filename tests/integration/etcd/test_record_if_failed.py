"""An etcd task record written before edges had a choice reads as one whose edges all fail."""

from __future__ import annotations

import orjson

from contend.domain.task import TaskSpec, TaskState
from contend.store.etcd.record import Record, task_of
from contend.store.etcd.submit import new_record


def test_a_record_without_if_failed_reads_as_every_edge_failing() -> None:
    spec = TaskSpec.build("t", depends_on=["a", "b"], if_failed=["run", "cancel"])
    rec = new_record(spec, TaskState.WAITING, None, 2, 1.0)
    assert Record.loads(rec.dumps()).if_failed == ["run", "cancel"]
    came = Record.__slots__.index("if_failed")
    older = orjson.dumps(orjson.loads(rec.dumps())[:came])  # the array before the field came
    old = Record.loads(older)
    assert old.if_failed is None
    task = task_of(old, None)
    assert task.if_failed == () and task.if_failed_of("a") == "fail"
