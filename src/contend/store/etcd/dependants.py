"""Tasks that wait on others. An edge ``w/{dependency}/{task}`` says that *task* waits for
*dependency*; when a task with waiters ends, ``s/{task}`` is written in the same transaction
as the ending, and settle() tells each waiter, applying what
``contend.domain.transitions.dependency_ended`` decides. A crash before the waiters are told
leaves the marker, and expire() settles it."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from contend.domain import transitions as rules
from contend.domain.task import TaskState, if_failed_of
from contend.store.etcd.keys import Keys, enc, unenc
from contend.store.etcd.outcomes import apply_outcome
from contend.store.etcd.record import Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.txn import WRITE_RETRIES, delete, mod_is, present, put


class Dependants:
    def __init__(self, etcd: Etcd, keys: Keys, clock: Callable[[], float]) -> None:
        self._etcd = etcd
        self._keys = keys
        self._clock = clock

    async def settle_many(self, task_ids: Iterable[str]) -> None:
        """Tell the waiters of these ended tasks, and of the waiters that died of it."""
        todo = list(task_ids)
        while todo:
            todo.extend(await self.settle(todo.pop()))

    async def leftovers(self) -> list[str]:
        """Ended tasks whose waiters were not told (a crash right after the ending)."""
        s_base = len(self._keys.k("s", ""))
        return [
            unenc(kv.key[s_base:].decode())
            for kv in await self._etcd.scan(self._keys.k("s", ""), keys_only=True)
        ]

    async def settle(self, task_id: str) -> list[str]:
        """Tell the waiters of an ended task; return the waiters that died in turn."""
        etcd, keys = self._etcd, self._keys
        t = (await etcd.read_many([keys.task(task_id)]))[0]
        skey = keys.k("s", enc(task_id))
        if t is None:
            await etcd.txn([], [delete(skey)])
            return []
        state = Record.loads(t.value).state
        base = keys.k("w", enc(task_id), "")
        died: list[str] = []
        for edge in await etcd.scan(base, keys_only=True):
            wid = unenc(edge.key[len(base) :].decode())
            if await self._tell(task_id, state, wid, edge.key):
                died.append(wid)
        await etcd.txn([], [delete(skey)])
        return died

    async def _tell(self, task_id: str, state: str, wid: str, edge: bytes) -> bool:
        """Tell waiter *wid* that *task_id* ended in *state*, and delete their edge; whether
        the waiter died of it and has waiters of its own."""
        etcd, keys = self._etcd, self._keys
        wkey = keys.task(wid)
        for _ in range(WRITE_RETRIES):
            w = (await etcd.read_many([wkey]))[0]
            if w is None:
                await etcd.txn([], [delete(edge)])
                break
            rec = Record.loads(w.value)
            ops = [delete(edge)]
            now = self._clock()
            dies = False
            if rec.state == TaskState.WAITING:
                choice = if_failed_of(rec.depends_on, rec.if_failed or (), task_id)
                outcome = rules.dependency_ended(task_id, TaskState(state), rec.deps_left, choice)
                rec.deps_left -= 1
                if outcome is None:  # it waits on
                    rec.updated_at = now
                else:
                    ops += apply_outcome(keys, rec, outcome, now)
                    dies = outcome.ends
                ops.append(put(wkey, rec.dumps()))
            resp = await etcd.txn([mod_is(wkey, w.mod_revision), present(edge)], ops)
            if resp.succeeded:
                return dies and rec.has_waiters
            if not (await etcd.read_many([edge]))[0]:
                break  # someone else settled this edge
        return False
