"""Tasks run in a child process (``@app.task(isolation="process")``), for a stop that is hard.

A sync function in a worker thread cannot be interrupted: when its expert loses the lease or
the task times out it is only told to stop (``ctx.cancelled``). A task with
``isolation="process"`` runs in a fresh Python process instead, which is killed (SIGKILL) the
moment its run must stop.

Nothing is pickled. The child (a new interpreter running :func:`child_main`) is told, in one JSON
line on its stdin, the function by its import path ``module:qualname``, the JSON args and
kwargs and, for a function that takes one, its context's fields. It imports the module itself,
calls the function (sync, or async under ``asyncio.run``) and answers on its stdout — the task's
own prints go to stderr — with JSON lines: a checkpoint to save (the parent saves it under the
run's fence and replies), then the result or the error. A child whose parent dies sees its
stdin close and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import queue
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import IO, Any

from contend.domain.task import JSON
from contend.errors import FencedOut, MemoryLimitExceeded, PayloadError
from contend.runtime.context import TaskContext, _current
from contend.store.port import TaskTransaction

ISOLATIONS = (None, "thread", "process")
#: The longest JSON line either side sends (a payload is at most 1 MiB of JSON, escaped).
LINE_LIMIT = 16 * 1024 * 1024
#: The child's exit status when its parent went away.
ORPHANED = 70
#: What the child runs (``python -c``; ``-m`` would load this module twice).
CHILD = "import sys; from contend.runtime.isolation import child_main; sys.exit(child_main())"


def import_path(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of *fn*; raises ValueError when a child could not import it."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname or not qualname:
        raise ValueError(
            f"{qualname or fn!r} must be a module-level function of an importable module "
            f"(not __main__, not nested) to run in a process of its own; it is in {module!r}"
        )
    return f"{module}:{qualname}"


class ChildFailed(Exception):
    """The task raised in its process: the exception's type, message and traceback there, and,
    when its class is one this process has loaded, an instance of it for the retry policy."""

    def __init__(self, kind: str, message: str, tb: str, error: BaseException | None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.tb, self.error = kind, message, tb, error


def _rebuild(module: str, qualname: str, message: str) -> BaseException | None:
    """An instance of the child's exception class, if this process already has it loaded (no
    module is imported for it), made without calling its ``__init__``."""
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        return None
    try:
        exc = obj.__new__(obj)
        exc.args = (message,)
    except Exception:
        return None
    return exc


def _child_env() -> dict[str, str]:
    """This process's environment, with its import path, so the child finds the same modules."""
    env = dict(os.environ)
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


async def run_in_process(
    target: str,
    args: list[JSON],
    kwargs: dict[str, JSON],
    ctx: TaskContext | None,
    checkpoint: Callable[[str], Awaitable[None]],
    progress: Callable[[str], Awaitable[None]] | None = None,
    *,
    memory_limit: int | None = None,
    task_type: str = "",
) -> JSON:
    """Run ``target`` in a child process; its result, or ChildFailed. Cancelled (the run must
    stop), the child is killed at once. With *memory_limit* (bytes), the child's resident memory
    is looked at every :data:`MEMORY_POLL` seconds, and a child over it is killed: the run
    raises :class:`~contend.errors.MemoryLimitExceeded`."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=_child_env(),
        limit=LINE_LIMIT,
    )
    assert proc.stdin is not None
    talk = asyncio.ensure_future(_converse(proc, target, args, kwargs, ctx, checkpoint, progress))
    watch = None if memory_limit is None else asyncio.ensure_future(_watch(proc, memory_limit))
    try:
        if watch is None:
            return await talk
        await asyncio.wait({talk, watch}, return_when=asyncio.FIRST_COMPLETED)
        if talk.done():
            return talk.result()
        assert memory_limit is not None
        raise MemoryLimitExceeded(task_type or target, watch.result(), memory_limit)
    finally:
        for part in (talk, watch):
            if part is not None and not part.done():
                part.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
        await asyncio.gather(*(p for p in (talk, watch) if p is not None), return_exceptions=True)
        proc.stdin.close()


async def _converse(
    proc: asyncio.subprocess.Process,
    target: str,
    args: list[JSON],
    kwargs: dict[str, JSON],
    ctx: TaskContext | None,
    checkpoint: Callable[[str], Awaitable[None]],
    progress: Callable[[str], Awaitable[None]] | None,
) -> JSON:
    """Send the child its call, save the checkpoints and progress it sends, return its result
    or raise."""
    assert proc.stdin is not None and proc.stdout is not None
    request = {"target": target, "args": args, "kwargs": kwargs, "ctx": _ctx_fields(ctx)}
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    await proc.stdin.drain()
    while True:
        line = await proc.stdout.readline()
        if not line:
            code = await proc.wait()
            raise ChildFailed(
                "ProcessDied", f"the task's process exited with {code} and no result", "", None
            )
        msg = json.loads(line)
        if "checkpoint" in msg or "progress" in msg:
            reply: dict[str, str | bool] = {"ok": True}
            try:
                if "checkpoint" in msg:
                    await checkpoint(msg["checkpoint"])
                elif progress is not None:
                    await progress(msg["progress"])
            except FencedOut as exc:
                reply = {"fenced": str(exc)}
            proc.stdin.write(json.dumps(reply).encode() + b"\n")
            await proc.stdin.drain()
        elif "result" in msg:
            result: JSON = msg["result"]
            return result
        else:
            e = msg["error"]
            if e["type"] == "PayloadError":
                raise PayloadError(e["message"])
            error = _rebuild(e["module"], e["qualname"], e["message"])
            raise ChildFailed(e["type"], e["message"], e["traceback"], error)


#: How often a child with a memory limit has its resident memory looked at, seconds.
MEMORY_POLL = 0.05
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_memory(pid: int) -> int | None:
    """The resident memory of process *pid* in bytes (Linux ``/proc``); None when gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def can_limit_memory() -> bool:
    """Whether this system lets a parent read a child's resident memory (Linux)."""
    return resident_memory(os.getpid()) is not None


async def _watch(proc: asyncio.subprocess.Process, limit: int) -> int:
    """Return the resident memory of *proc* once it is over *limit* (never, while it is not)."""
    while True:
        used = resident_memory(proc.pid)
        if used is not None and used > limit:
            return used
        await asyncio.sleep(MEMORY_POLL)


def _ctx_fields(ctx: TaskContext | None) -> dict[str, JSON] | None:
    if ctx is None:
        return None
    return {
        "task_id": ctx.task_id,
        "type": ctx.type,
        "queue": ctx.queue,
        "fence": ctx.fence,
        "attempt": ctx.attempt,
        "max_attempts": ctx.max_attempts,
        "expert": ctx.expert,
        "state": ctx.state,
    }


# -- the child -----------------------------------------------------------------------------
class _Parent:
    """The child's side of the pipes: requests out on a private copy of stdout, replies in on
    stdin (a reader thread; stdin closing means the parent is gone: exit)."""

    def __init__(self, out: IO[str], inp: IO[str]) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, args=(inp,), daemon=True).start()

    def _read(self, inp: IO[str]) -> None:
        for line in inp:
            self._replies.put(json.loads(line))
        os._exit(ORPHANED)

    def send(self, msg: dict[str, Any]) -> None:
        with self._lock:
            self._out.write(json.dumps(msg) + "\n")
            self._out.flush()

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._out.write(json.dumps(msg) + "\n")
            self._out.flush()
            return self._replies.get()


class _PipeHost:
    """A context's host in the child: checkpoints go to the parent, which saves them."""

    def __init__(self, parent: _Parent, ctx: TaskContext) -> None:
        self._parent, self._ctx = parent, ctx

    async def checkpoint(self, text: str) -> None:
        await self._ask({"checkpoint": text})

    def must_stop(self) -> str | None:
        return None  # the parent kills this process when its run must stop

    async def progress(self, text: str) -> None:
        await self._ask({"progress": text})

    async def _ask(self, msg: dict[str, str]) -> None:
        loop = asyncio.get_running_loop()
        reply = await loop.run_in_executor(None, self._parent.ask, msg)
        if "fenced" in reply:
            raise FencedOut(self._ctx.task_id, self._ctx.fence, reply["fenced"])

    async def begin(self) -> TaskTransaction:
        raise RuntimeError(
            "ctx.transaction() is not available to a task run with isolation='process': its "
            "connection to the store stays in the expert"
        )

    async def commit(self, tx: TaskTransaction) -> None:
        await self.begin()

    async def rollback(self, tx: TaskTransaction) -> None:
        return None

    async def parents(self) -> dict[str, JSON]:
        raise RuntimeError(
            "ctx.parents() is not available with isolation='process': declare a parameter "
            "named parents, which gets the same results"
        )

    async def pause(self, tries: int) -> None:
        return None


def _resolve(target: str) -> Callable[..., Any]:
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target} is not a function")
    return obj  # type: ignore[no-any-return]


def _call(parent: _Parent, request: dict[str, Any]) -> JSON:
    fn = _resolve(request["target"])
    args, kwargs = list(request["args"]), dict(request["kwargs"])
    fields = request.get("ctx")
    loop: asyncio.AbstractEventLoop | None = None
    if fields is not None:
        ctx = TaskContext(**fields)
        ctx._host = _PipeHost(parent, ctx)
        if not inspect.iscoroutinefunction(fn):  # checkpoint_sync needs a loop to run on
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True).start()
            ctx._loop = loop
        args = [ctx, *args]
        _current.set(ctx)
    if inspect.iscoroutinefunction(fn):

        async def main() -> Any:
            if fields is not None:
                args[0]._loop = asyncio.get_running_loop()
            return await fn(*args, **kwargs)

        return asyncio.run(main())
    return fn(*args, **kwargs)


def child_main() -> int:
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")  # the private channel to the parent
    os.dup2(2, 1)  # what the task prints goes to stderr
    inp = sys.stdin
    request = json.loads(inp.readline())
    parent = _Parent(out, inp)
    try:
        result = _call(parent, request)
        try:
            text = json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise PayloadError(f"the result is not JSON: {exc}") from exc
        parent.send({"result": json.loads(text)})
    except BaseException as exc:
        parent.send(
            {
                "error": {
                    "type": type(exc).__name__,
                    "module": type(exc).__module__,
                    "qualname": type(exc).__qualname__,
                    "message": str(exc),
                    "traceback": traceback.format_exc(limit=20),
                }
            }
        )
    return 0
