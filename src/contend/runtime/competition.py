"""What an expert knows about the contest: its own record, its rivals, the cluster's load.

Kept apart from the claim loop so that the policies read as plain code: who counts as a rival,
when a race cannot change the outcome, how long to wait, and when an emergency expert joins in.
Everything here is fed from the expert's heartbeats (its own and its rivals', via the store) and
does no I/O of its own.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contend.domain.scoring import (
    MIN_RUNS,
    ExpertView,
    Fitness,
    TaskView,
    TypeRecord,
    adaptive_window,
    identity_of,
    race_delay,
    scores_by_shape,
    shape_of,
)
from contend.domain.task import Capabilities
from contend.store.port import Backlog, ExpertRecord

#: A rival within this fraction of the best fitness counts as equally fit: no wait.
TIE = 0.05
#: The least margin, seconds, an expert leaves after a rival's expected claim before its own
#: late check reads.
SLACK_MIN = 0.001
#: At most this many task types are tracked per expert (the rest are not scored on history).
MAX_TYPES = 1000
#: At most this many tasks (or task shapes) have their rivals' scores kept between two
#: heartbeats; past that the memo starts again.
MAX_BEST = 4096
#: ...and when each rival's score is kept (rivals' round trips known), at most this many
#: scores in all.
MAX_SCORES = 262_144
#: A race's peek looks at least this deep, and 3 candidates per free slot.
PEEK_MIN = 16
#: ...and as deep as its rivals have free slots, up to this many: rivals that all peek the
#: same few tasks at the head of a backlog take it a few at a time, round after round, while
#: the tasks behind it wait (at 1,000 experts and 2,000 tasks a batch's last task started
#: 0.25 s in: makespan 13 % over the greedy planner's; 2 % at depth 512, and no better
#: at 2,000 for twice the CPU). A peek of a short backlog returns what there is, whatever
#: the depth, so a deep peek costs only where there is a backlog to see.
PEEK_MAX = 512


class TypeTracker:
    """Per task type: successes, failures and an exponentially weighted mean run time."""

    def __init__(self, alpha: float = 0.2, limit: int = MAX_TYPES) -> None:
        self.alpha = alpha
        self.limit = limit
        self._records: dict[str, list[float]] = {}  # type -> [done, failed, mean_seconds]

    def record(self, task_type: str, ok: bool, seconds: float) -> None:
        rec = self._records.get(task_type)
        if rec is None:
            if len(self._records) >= self.limit:
                return
            rec = self._records[task_type] = [0, 0, seconds]
        if ok:
            rec[0] += 1
            rec[2] = seconds if rec[0] == 1 else (1 - self.alpha) * rec[2] + self.alpha * seconds
        else:
            rec[1] += 1

    def snapshot(self) -> dict[str, TypeRecord]:
        return {
            t: TypeRecord(int(r[0]), int(r[1]), r[2] if r[0] else None)
            for t, r in self._records.items()
        }

    def to_json(self) -> dict[str, list[float]]:
        return {t: [int(r[0]), int(r[1]), round(r[2], 6)] for t, r in self._records.items()}


def records_from_json(data: Any) -> dict[str, TypeRecord]:
    out: dict[str, TypeRecord] = {}
    if not isinstance(data, Mapping):
        return out
    for t, r in list(data.items())[:MAX_TYPES]:
        try:
            done, failed, mean = int(r[0]), int(r[1]), float(r[2])
        except (TypeError, ValueError, IndexError):
            continue
        out[str(t)] = TypeRecord(done, failed, mean if done else None)
    return out


@dataclass(frozen=True)
class PressurePolicy:
    """When is the cluster under pressure (the moment emergency experts join in)?"""

    backlog_per_expert: float = 10.0  # due pending tasks per live non-emergency expert
    max_wait: float = 30.0  # age of the oldest due pending task, seconds
    utilisation: float = 0.8  # busy slots / all slots of live non-emergency experts

    def under_pressure(
        self, backlog: Backlog, experts: int, utilisation: float, *, active: bool
    ) -> bool:
        """Hysteresis: an active emergency expert stays until pressure falls to half."""
        scale = 0.5 if active else 1.0
        return (
            backlog.pending / max(1, experts) > self.backlog_per_expert * scale
            or (backlog.oldest_age or 0.0) > self.max_wait * scale
            or (utilisation > self.utilisation * (0.75 if active else 1.0) and backlog.pending > 0)
        )


def expert_view(
    p: ExpertRecord,
    typical: Mapping[str, float],
    history: Mapping[str, TypeRecord] | None = None,
) -> ExpertView:
    """What an expert's heartbeats tell others of it, as a fitness function sees it
    (*history*: its per-type records, when the caller has read them already)."""
    return ExpertView(
        name=p.info.id,
        capabilities=p.info.capabilities,
        capacity=p.info.capacity,
        load=p.load,
        tier=p.info.tier,
        specialties=frozenset(p.metrics.get("specialties", ()) or ()),
        history=records_from_json(p.metrics.get("types")) if history is None else history,
        typical_seconds=typical,
    )


class Competition:
    """An expert's picture of the contest, refreshed at every heartbeat."""

    def __init__(
        self,
        name: str,
        capabilities: Capabilities,
        capacity: int,
        queues: Sequence[str],
        *,
        tier: str = "general",
        specialties: frozenset[str] = frozenset(),
        fitness: Fitness,
        window: float,
        jitter: float = 0.1,
        zone_margin: float = 0.0,
        pressure: PressurePolicy | None = None,
        rand: Callable[[], float] = random.random,
        fifo: frozenset[str] = frozenset(),
        central: frozenset[str] = frozenset(),
    ) -> None:
        self.name = name
        self.rand = rand
        #: Queues dispatched first come, first served: no race delay for their tasks.
        self.fifo = fifo
        #: Queues whose leader assigns their tasks: claimed by the assignee at once.
        self.central = central
        self.capabilities = capabilities
        self.capacity = capacity
        self.queues = set(queues)
        self.tier = tier
        self.specialties = specialties
        self.fitness = fitness
        self.base_window = window
        self.jitter = jitter
        self.zone_margin = zone_margin
        self.pressure = pressure or PressurePolicy()
        self.tracker = TypeTracker()
        self.peers: list[ExpertRecord] = []
        #: The live rivals holding prefetched tasks, the most first: whom an idle expert may
        #: steal from. An idle expert looks at every change of the store; these are few.
        self.loaded: list[ExpertRecord] = []
        self._rivals: list[ExpertView] = []
        self._rivals_free = 0  # the rivals' free slots, as of their last heartbeats
        #: Whether a rival differs from this expert in capabilities, tier or specialties:
        #: then a race always matters (see race_matters).
        self._unlike = False
        #: each rival's claim round trip, seconds, as its heartbeat said (when it did)
        self._rtt: dict[str, float] = {}
        #: The rivals' scores per task (per task shape for a by_shape fitness), for the rivals
        #: as of the last update_peers: fitness is pure, so they hold until the next. The
        #: best, and each rival's when their round trips are known (plan needs them then).
        self._scores: dict[Hashable, tuple[float, tuple[float, ...]]] = {}
        self._scores_most = MAX_BEST
        self._key = shape_of if scores_by_shape(fitness) else identity_of
        self.cluster_load = 0.0
        self.window = window
        self.typical: dict[str, float] = {}
        self.lost_races = 0
        #: This expert as its last heartbeat published it: what its rivals score it by, and so
        #: what it scores itself by in a race. Scored on its live load and run times instead,
        #: two equal experts each saw the other as it was seconds ago, both went first, and
        #: one lost (a fifth of all lost races across three zones).
        self._published: ExpertView | None = None
        self.active = tier != "emergency"  # emergency experts wait for pressure

    # -- views -----------------------------------------------------------------------------
    def me(self, load: int) -> ExpertView:
        return ExpertView(
            name=self.name,
            capabilities=self.capabilities,
            capacity=self.capacity,
            load=load,
            tier=self.tier,
            specialties=self.specialties,
            history=self.tracker.snapshot(),
            typical_seconds=self.typical,
        )

    def peek_depth(self, free: int) -> int:
        """How many candidates a race peeks with *free* slots: 3 per slot, at least
        PEEK_MIN, and as many as its rivals had free slots at their last heartbeats (at
        most PEEK_MAX), so that rivals do not all reach for the same few tasks."""
        return max(PEEK_MIN, 3 * free, min(PEEK_MAX, self._rivals_free))

    def rivals(self) -> list[ExpertView]:
        """The live rivals on a shared queue, as of the last :meth:`update_peers` (do not
        modify the list)."""
        return self._rivals

    def _views_of_rivals(
        self, live: list[ExpertRecord], histories: list[dict[str, TypeRecord]]
    ) -> list[ExpertView]:
        """Views of the *live* experts (not this one) that share a queue with it, with the
        *histories* read from their heartbeats."""
        out = []
        for p, history in zip(live, histories, strict=True):
            if self.queues.isdisjoint(p.info.queues):
                continue
            if p.info.tier == "emergency" and not p.metrics.get("active", False):
                continue
            out.append(expert_view(p, self.typical, history))
        return out

    def update_peers(self, peers: list[ExpertRecord], my_load: int) -> None:
        """Take in a fresh list of experts: rivals, the cluster's load, typical run times."""
        self.peers = peers
        mine = next((p for p in peers if p.info.id == self.name), None)
        live = [p for p in peers if p.alive and p.info.id != self.name]
        load = my_load + sum(p.load for p in live)
        slots = self.capacity + sum(p.info.capacity for p in live)
        self.cluster_load = load / slots if slots else 0.0
        self.window = adaptive_window(self.base_window, self.cluster_load)
        typical: dict[str, float] = {}
        # each rival's records, read once: for the typical run times and for its view (among
        # 1,000 simulated experts, reading them twice was a third of a heartbeat's cost)
        histories = [records_from_json(p.metrics.get("types")) for p in live]
        for recs in (self.tracker.snapshot(), *histories):
            for t, r in recs.items():
                if r.done >= MIN_RUNS and r.mean_seconds:
                    typical[t] = min(typical.get(t, r.mean_seconds), r.mean_seconds)
        self.typical = typical
        # read at every claim round: built once here
        self._rivals = self._views_of_rivals(live, histories)
        self._rivals_free = sum(max(0, r.capacity - r.load) for r in self._rivals)
        self._published = None if mine is None else expert_view(mine, typical)
        self._unlike = any(not self._alike(r) for r in self._rivals)
        self._rtt = {p.info.id: rtt for p in live if (rtt := _claim_seconds(p)) > 0}
        self._scores = {}
        self._scores_most = (
            max(64, MAX_SCORES // max(1, len(self._rivals))) if self._rtt else MAX_BEST
        )
        self.loaded = sorted(
            (p for p in live if int(p.metrics.get("prefetched", 0) or 0) > 0),
            key=lambda p: -int(p.metrics.get("prefetched", 0) or 0),
        )

    def utilisation_of_regulars(self, my_load: int) -> tuple[int, float]:
        regulars = [
            p
            for p in self.peers
            if p.alive and p.info.tier != "emergency" and p.info.id != self.name
        ]
        slots = sum(p.info.capacity for p in regulars)
        busy = sum(p.load for p in regulars)
        return len(regulars), (busy / slots if slots else 1.0)

    def update_pressure(self, backlog: Backlog, my_load: int) -> bool:
        """For an emergency expert: join while the cluster is under pressure, leave after."""
        if self.tier != "emergency":
            return True
        n, util = self.utilisation_of_regulars(my_load)
        self.active = self.pressure.under_pressure(backlog, n, util, active=self.active)
        return self.active

    # -- the race --------------------------------------------------------------------------
    def race_matters(self, load: int) -> bool:
        """A race changes nothing when this expert is alone or every live rival has the same
        profile (capabilities, tier, specialties, and speed within 20 % on every type): then
        the expert claims at once, with no extra read and no wait.

        Speeds that differ by less than the race window do not count either: the race would
        hold a task back for longer than the faster expert could save on it. Without that,
        the run-time noise of millisecond tasks (a garbage collection, a busy core) turns
        races on and off among equal experts."""
        if self.window <= 0 or self.queues <= self.fifo | self.central:
            return False
        rivals = self.rivals()
        if not rivals:
            return False
        if self._unlike:
            # known since the heartbeat: looking for it rival by rival took 150 comparisons
            # of records per claim round for a GPU expert among 1,000 simulated ones
            return True
        mine = self.tracker.snapshot()
        for r in rivals:
            for t in set(mine) | set(r.history):
                a, b = mine.get(t), r.history.get(t)
                if a is None or b is None or a.runs < MIN_RUNS or b.runs < MIN_RUNS:
                    continue
                if abs(a.success_rate - b.success_rate) > 0.1:
                    return True
                if a.mean_seconds and b.mean_seconds:
                    ratio = a.mean_seconds / b.mean_seconds
                    saved = abs(a.mean_seconds - b.mean_seconds)
                    if not 1 / 1.2 <= ratio <= 1.2 and saved > self.window:
                        return True
        return False

    def _alike(self, r: ExpertView) -> bool:
        """Whether rival *r* has this expert's capabilities, tier and specialties."""
        return (
            r.capabilities == self.capabilities
            and r.tier == self.tier
            and r.specialties == self.specialties
        )

    def rival_scores(self, view: TaskView) -> tuple[float, tuple[float, ...]]:
        """The highest score any live rival has for *view* (−inf with no rivals), and each
        rival's score when their round trips are known (else none). Rivals are as of the last
        heartbeat and fitness is pure, so each task (each shape, for a by_shape fitness) is
        scored against them once between two heartbeats: with hundreds of rivals, scoring
        every candidate of every claim round was most of a round's cost."""
        key = self._key(view)
        found = self._scores.get(key)
        if found is None:
            fitness = self.fitness
            theirs = tuple([fitness(r, view) for r in self._rivals])
            found = (max(theirs, default=-math.inf), theirs if self._rtt else ())
            if len(self._scores) >= self._scores_most:
                self._scores.clear()
            self._scores[key] = found
        return found

    def plan(
        self, views: Sequence[TaskView], load: int, rtt: float = 0.0
    ) -> list[tuple[float, int, str]]:
        """(delay, position, task id) for each candidate, soonest first; *rtt*: this expert's
        claim round trip, seconds."""
        me = self.me(load) if self._published is None else self._published
        rivals = self.rivals()
        plan = []
        for n, view in enumerate(views):
            if view.queue in self.fifo:
                plan.append((0.0, n, view.id))
                continue
            mine = self.fitness(me, view)
            top, theirs = self.rival_scores(view)
            best = max(mine, top)
            if best <= 0:
                delay = 0.0
            elif mine >= best * (1 - TIE):
                # the fittest, or as fit as the fittest: no wait, but a tie is broken by a
                # random share of the jitter, so equals do not all reach for it at once
                tied = top >= mine * (1 - TIE)
                delay = self.window * self.jitter * self.rand() if tied else 0.0
            else:
                delay = race_delay(self.window, mine / best, self.jitter, self.rand)
            if self._off_zone(view, me.capabilities):
                delay += self.zone_margin
            if best > 0 and self._rtt:
                delay = max(delay, self._after_rivals(view, mine, best, rivals, theirs, rtt))
            plan.append((delay, n, view.id))
        plan.sort()
        return plan

    def deferrals(self, views: Sequence[TaskView], load: int) -> dict[str, float]:
        """Seconds to leave each of *views* to faster rivals, for the tasks a faster rival
        would finish sooner even though it has to free a slot first; *views* must be every
        claimable task (a peek that came back short), so that the queue before each is known.

        A task of a type capable rivals run in ``fast`` seconds (the fastest of their mean
        run times) and this expert in ``mine`` (its own mean; until it has one, ``fast``
        scaled by how much fitter the fittest rival is) is left to the rivals at least a
        fifth faster than ``mine`` while ``(ahead / slots + 1) × fast < mine``: *ahead* is
        how many tasks of that type stand before it and it, *slots* those rivals' capacity.
        It waits at most ``mine − fast`` (claimed after that, it ends no later than theirs
        would have): the seconds returned. A free slow expert that claimed at once ran a
        4-second task for 16 s that a specialist finishing its run would have done in 1 s
        more (the simulator's 10-expert stream: mean completion 1.09 s against the
        planner's 0.72)."""
        out: dict[str, float] = {}
        if not self._rivals:
            return out
        me = self.me(load) if self._published is None else self._published
        records = self.tracker.snapshot()
        ahead: dict[str, int] = {}
        for view in views:
            if view.queue in self.fifo or view.queue in self.central:
                continue
            means = self._rival_means(view)
            if not means:
                continue
            fast = min(m for m, _ in means)
            rec = records.get(view.type)
            if rec is not None and rec.runs >= MIN_RUNS and rec.mean_seconds:
                mine = rec.mean_seconds
            else:
                fit, (top, _) = self.fitness(me, view), self.rival_scores(view)
                if fit <= 0 or top <= fit:
                    continue
                mine = fast * top / fit
            slots = sum(c for m, c in means if m * 1.2 <= mine)
            if not slots:
                continue
            ahead[view.type] = n = ahead.get(view.type, 0) + 1
            if (n / slots + 1.0) * fast < mine:
                out[view.id] = mine - fast
        return out

    def _rival_means(self, view: TaskView) -> list[tuple[float, int]]:
        """(mean run time on *view*'s type, capacity) of each live rival that can run it and
        has run it often enough to say."""
        out = []
        for r in self._rivals:
            rec = r.history.get(view.type)
            if rec is None or rec.done < MIN_RUNS or not rec.mean_seconds:
                continue
            if r.capabilities.satisfies(view.requirements):
                out.append((rec.mean_seconds, r.capacity))
        return out

    def _off_zone(self, view: TaskView, capabilities: Capabilities) -> bool:
        prefer = view.requirements.prefer
        return bool(prefer) and not prefer <= capabilities.tags

    def _start(self, view: TaskView, fit: float, best: float, capabilities: Capabilities) -> float:
        """When an expert of fitness *fit* goes for *view*, jitter left out."""
        start = 0.0 if fit >= best * (1 - TIE) else self.window * (1.0 - fit / best)
        return start + (self.zone_margin if self._off_zone(view, capabilities) else 0.0)

    def _after_rivals(
        self,
        view: TaskView,
        mine: float,
        best: float,
        rivals: Sequence[ExpertView],
        theirs: Sequence[float],
        own: float,
    ) -> float:
        """The soonest this expert may go for *view* so that its late check sees the claims of
        the rivals due before it; *own*: this expert's round trip.

        Each heartbeat says how long its expert's claims take. Counted from the task's
        commit, a rival's claim lands after half a round trip for the wake-up, one for its
        peek, one for its own late check if it waits, and half for the claim; this expert's
        late check reads after half a round trip, its peek and half another. A claim that
        lands after that read makes a lost race; a rival with no free slot claims nothing.

        Rivals due at the same moment take turns in the task's rendezvous order (a hash of
        task and expert, the same in every process), each waiting out the round trips of
        those before it, at most one race window: the candidates of equals are split among
        them instead of all being chased by all. Rivals whose round trip is not known (the
        memory store, an older expert) are not waited for: the plain race's delay stands."""
        mine_at = self._start(view, mine, best, self.capabilities)
        tie = self.window * TIE
        rank = _rank(view.id, self.name)
        # a rival alone at the top claims what it peeked; one tied there waits its jitter and
        # reads again first
        tied = sum(1 for f in (mine, *theirs) if f >= best * (1 - TIE)) > 1
        wait = turns = 0.0
        for rival, fit in zip(rivals, theirs, strict=True):
            rtt = self._rtt.get(rival.name)
            if fit <= 0 or rtt is None or rival.headroom <= 0:
                continue
            at = self._start(view, fit, best, rival.capabilities)
            if at < mine_at - tie:
                waits = at > 0 or tied
                lands = at + rtt * (3.0 if waits else 2.0)
                if waits and at == 0:
                    lands += self.window * self.jitter
                wait = max(wait, lands + _slack(rtt) - 2.0 * own)
            elif at <= mine_at + tie and _rank(view.id, rival.name) < rank:
                turns += rtt + _slack(rtt)
        if not turns:
            return wait
        # after the latest the one before may go: its delay carries jitter, which turns replace
        spread = (
            self.window * self.jitter * (1.0 if mine >= best * (1 - TIE) else 1.0 - mine / best)
        )
        return max(wait, mine_at + spread + min(turns, self.window))

    def metrics(self, claim_attempts: int, claims_won: int) -> dict[str, Any]:
        return {
            "types": self.tracker.to_json(),
            "lost_races": claim_attempts - claims_won,
            "window": round(self.window, 6),
            "cluster_load": round(self.cluster_load, 4),
            "tier": self.tier,
            "active": self.active,
            "specialties": sorted(self.specialties),
        }


class LeftToRivals:
    """The tasks one expert leaves to faster rivals for now (``Competition.deferrals``),
    reckoned from when it first saw each one pending; ``wake`` says when the first of them
    becomes its own to claim (None: none left), which ends an idle wait once."""

    def __init__(self, competition: Competition, monotonic: Callable[[], float]) -> None:
        self.competition = competition
        self.monotonic = monotonic
        self.wake: float | None = None
        self._seen: dict[str, float] = {}  # task id -> when first seen pending

    def keep(self, races: list[TaskView], load: int, shallow: bool) -> list[TaskView]:
        """*races* but those left to rivals; *shallow* says the peek saw every claimable task
        (it came back short), without which the queue before each task is unknown and none
        is left."""
        if not shallow:
            self._seen.clear()
            return races
        defer = self.competition.deferrals(races, load)
        now = self.monotonic()
        seen, self._seen = self._seen, {}
        out: list[TaskView] = []
        for view in races:
            first = self._seen[view.id] = seen.get(view.id, now)
            until = first + defer.get(view.id, 0.0)
            if until <= now:
                out.append(view)
            elif self.wake is None or until < self.wake:
                self.wake = until
        return out

    def take_wake(self) -> float | None:
        """When the first task left becomes this expert's, once: the round after the wait
        reckons it again."""
        wake, self.wake = self.wake, None
        return wake


def _claim_seconds(p: ExpertRecord) -> float:
    ms = p.metrics.get("claim_ms")
    return float(ms) / 1000 if isinstance(ms, int | float) and ms > 0 else 0.0


def _slack(rtt: float) -> float:
    """What a waiting expert adds to a rival's expected landing: the rival's own processing
    and the spread of its round trip, as half that round trip and at least SLACK_MIN."""
    return max(SLACK_MIN, 0.5 * rtt)


def _rank(task_id: str, expert: str) -> int:
    """An expert's place among equals for one task: the same in every process."""
    return zlib.crc32(f"{task_id}\0{expert}".encode())
