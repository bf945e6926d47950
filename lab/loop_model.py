"""A modelled asyncio server on virtual time, with the shipped gate in front of it: one event loop and its upstream.

The server is one event loop, a FIFO of jobs each costing CPU (parsing, the app's task, a 429, a response), in
front of either an I/O upstream (``workers`` slots of ``service`` seconds; a request that waits ``queue_timeout``
for a slot is answered 503) or a CPU-bound handler (``burn`` seconds of CPU on the loop itself). A timer on the loop
measures its lag every :data:`PERIOD`, as :class:`admitgate.asgi.lag.LagMonitor` does. The gate is the package's
:class:`~admitgate.core.gate.Gate` with its capacity source, driven through its engine API on the model's clock:
holds wake on the loop, room in flight wakes them as the middleware does. Clients: open loop (Poisson arrivals),
closed loop (``n`` connections, each sending again at once), and a herd of clients obeying Retry-After beside
new arrivals.

:mod:`admitgate.sim` models herds on an I/O upstream; this model adds the event loop as a queue of its own (a
CPU-bound app's overload shows there first) and closed-loop clients, for the ablation benchmark
(``bench/ablation.py``). Times are seconds, rates requests/s.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from admitgate.core.decision import Decision, Verdict
from admitgate.core.gate import Gate
from admitgate.core.priority import DEFAULT_CLASSES
from admitgate.sim.summary import Attempt, HerdResult

#: The event loop's CPU per part of a request, seconds: parsing it, the app's task, a 429, a response.
PARSE, TASK, REJECT, RESPOND = 40e-6, 30e-6, 40e-6, 20e-6
#: One-way network delay, seconds.
NET = 0.0002
#: The lag monitor's period, seconds.
PERIOD = 0.025
_DEFAULT = DEFAULT_CLASSES["default"]
Answer = Callable[[float, int, Any], None]


@dataclass(frozen=True)
class Shape:
    """An upstream: ``kind`` ``"io"`` (``workers`` × ``service`` s, 503 after ``queue_timeout`` s waiting) or
    ``"cpu"`` (``burn`` s of CPU per request on the loop)."""

    kind: str
    workers: int = 20
    service: float = 0.1
    queue_timeout: float = 1.0
    burn: float = 0.0

    @property
    def capacity(self) -> float:
        """Requests/s the service sustains (the loop's own costs included for a CPU-bound one)."""
        if self.kind == "io":
            return self.workers / self.service
        return 1.0 / (self.burn + PARSE + TASK + RESPOND)


@dataclass
class Outcome:
    """One request as its client saw it: ``done`` is inf while unanswered."""

    sent: float
    done: float = math.inf
    status: int = 0
    retry_after: Any = None


class Server:
    """The modelled server (see the module docstring); ``gate`` None serves everything (the bare baseline)."""

    def __init__(self, shape: Shape, gate: Gate | None, seed: int = 1) -> None:
        self.shape, self.gate, self.rng = shape, gate, random.Random(seed)
        self.now = 0.0
        self.burn = shape.burn
        self.workers = shape.workers
        self._events: list[tuple[float, int, Callable[[float, Any], None], Any]] = []
        self._seq = 0
        self._ready: deque[Callable[[float], float]] = deque()
        self._loop_busy = False
        self._busy_workers = 0
        self._upstream_queue: deque[list[Any]] = deque()
        self._fresh = 0
        self.probes = gate.probes if gate is not None else None
        if self.probes is not None:
            self.at(PERIOD, self._lag_due, PERIOD)

    def at(self, t: float, fn: Callable[[float, Any], None], arg: Any = None) -> None:
        """Run ``fn(t, arg)`` at virtual time ``t``."""
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, fn, arg))

    def run(self, until: float) -> None:
        """Run every event due by ``until``."""
        events = self._events
        while events and events[0][0] <= until:
            t, _, fn, arg = heapq.heappop(events)
            self.now = t
            fn(t, arg)

    def set_workers(self, t: float, n: int) -> None:
        """The I/O upstream now has ``n`` workers."""
        self.workers = n
        self._fill(t)

    # the event loop
    def _submit(self, t: float, job: Callable[[float], float]) -> None:
        self._ready.append(job)
        if not self._loop_busy:
            self._loop_busy = True
            self.at(t, self._next_job)

    def _next_job(self, t: float, _: Any) -> None:
        if not self._ready:
            self._loop_busy = False
            return
        self.at(t + self._ready.popleft()(t), self._next_job)

    def _lag_due(self, t: float, due: float) -> None:
        def measure(start: float) -> float:
            assert self.probes is not None
            self.probes.lag(start - due, start)
            self.probes.lag_due = start + PERIOD
            self.at(start + PERIOD, self._lag_due, start + PERIOD)
            return 5e-6

        self._submit(t, measure)

    # a request's way through the server
    def request(self, t: float, answer: Answer, key: Any = None) -> None:
        """A request reaches the server at ``t``; ``answer(t_at_client, status, retry_after)`` is called once.
        ``key``: the client's identity (None: a fresh one each time)."""
        self._submit(t, lambda start: self._parse(start, answer, key))

    def _parse(self, start: float, answer: Answer, key: Any) -> float:
        self._submit(start, lambda s: self._task(s, answer, key))
        return PARSE

    def _task(self, start: float, answer: Answer, key: Any) -> float:
        if self.gate is None:
            return self._serve(start, answer)
        self._fresh += 1
        ident = key if key is not None else ("fresh", self._fresh)
        return self._decided(start, self.gate.admit(1.0, _DEFAULT, start, lambda: ident), answer)

    def _decided(self, start: float, d: Decision, answer: Answer) -> float:
        if d.verdict is Verdict.REJECT and not d.delay:
            self.at(start + REJECT + NET, lambda t, _: answer(t, 429, d.retry_after))
            return REJECT
        if d.delay:  # a hold: woken on the loop when it ends, or when room comes for a hold waiting for room
            over = [False]

            def end(t: float, _: Any) -> None:
                if not over[0]:
                    over[0] = True
                    self._submit(t, lambda s: self._woken(s, d, answer))

            if d.room:
                assert self.gate is not None

                def wake() -> bool:
                    if over[0]:
                        return False
                    end(self.now, None)
                    return True

                self.gate.wait_room(wake)
            self.at(start + d.delay, end)
            return TASK
        return self._serve(start, answer)

    def _woken(self, start: float, d: Decision, answer: Answer) -> float:
        assert self.gate is not None
        after = self.gate.end_hold(d, start)
        assert after is not None
        return self._decided(start, after, answer)

    def _serve(self, start: float, answer: Answer) -> float:
        if self.probes is not None:
            self.probes.admit(start)
        if self.shape.kind == "cpu":
            cost = TASK + self.burn + RESPOND
            self.at(start + cost, lambda t, _: self._complete(t, start, 200, answer))
            return cost
        entry = [start, answer, True]  # (admitted at, answer, waiting for a worker)
        if self._busy_workers < self.workers:
            self._start(start + TASK, entry)
        else:
            self._upstream_queue.append(entry)
            self.at(start + TASK + self.shape.queue_timeout, self._timed_out, entry)
        return TASK

    def _start(self, t: float, entry: list[Any]) -> None:
        entry[2] = False
        self._busy_workers += 1
        self.at(t + self.shape.service, self._done, entry)

    def _fill(self, t: float) -> None:
        while self._upstream_queue and self._busy_workers < self.workers:
            entry = self._upstream_queue.popleft()
            if entry[2]:
                self._start(t, entry)

    def _done(self, t: float, entry: list[Any]) -> None:
        self._busy_workers -= 1
        self._fill(t)
        self._submit(t, lambda s: self._respond(s, entry[0], 200, entry[1]))

    def _timed_out(self, t: float, entry: list[Any]) -> None:
        if entry[2]:
            entry[2] = False
            self._submit(t, lambda s: self._respond(s, entry[0], 503, entry[1]))

    def _respond(self, start: float, admitted: float, status: int, answer: Answer) -> float:
        self.at(start + RESPOND, lambda t, _: self._complete(t, admitted, status, answer))
        return RESPOND

    def _complete(self, t: float, admitted: float, status: int, answer: Answer) -> None:
        if self.probes is not None and self.gate is not None:
            self.probes.complete(t - admitted, status, t)
            self.gate.room_freed()
        self.at(t + NET, lambda tt, _: answer(tt, status, None))

    # clients
    def open_loop(self, rate: float, until: float, out: list[Outcome]) -> None:
        """Poisson arrivals at ``rate`` until ``until``, one try each, recorded in ``out``."""

        def arrive(t: float, _: Any) -> None:
            if t >= until:
                return
            self.at(t + self.rng.expovariate(rate), arrive)
            out.append(o := Outcome(t))
            self.at(t + NET, lambda tt, _: self.request(tt, _recorder(o)))

        self.at(self.rng.expovariate(rate), arrive)

    def closed_loop(self, n: int, start: float, until: float, out: list[Outcome]) -> None:
        """``n`` connections from ``start``, each sending its next request as its answer comes, until ``until``."""

        def send(t: float, _: Any) -> None:
            if t >= until:
                return
            out.append(o := Outcome(t))

            def answered(tt: float, status: int, ra: Any) -> None:
                o.done, o.status, o.retry_after = tt, status, ra
                self.at(tt, send)

            self.at(t + NET, lambda tt, _: self.request(tt, answered))

        for _ in range(n):
            self.at(start, send)

    def herd(self, clients: int, release: float, until: float, new_rate: float = 0.0, ignore: float = 0.0,
             first: int = 0) -> HerdResult:  # fmt: skip
        """``clients`` released at ``release``, each retrying at its Retry-After until served (a share ``ignore`` of
        them every 0.1 s on fresh connections, unrecognised), and Poisson new arrivals at ``new_rate`` from the
        start, one try each; identities from ``first`` on."""
        result = HerdResult(clients)
        ignorers = set(self.rng.sample(range(clients), round(clients * ignore)))

        def attempt(t: float, i: int) -> None:
            if t >= until:
                return

            def answered(tt: float, status: int, ra: Any) -> None:
                result.attempts.append(Attempt(i, t - release, tt - release, status, ra))
                if status == 200:
                    result.finished[i] = tt - release
                else:
                    self.at(tt + (0.1 if i in ignorers else float(ra if ra is not None else 1.0)), attempt, i)

            key = None if i in ignorers else first + i
            self.at(t + NET, lambda tt, _: self.request(tt, answered, key))

        def new(t: float, _: Any) -> None:
            if t >= until:
                return
            self.at(t + self.rng.expovariate(new_rate), new)

            def answered(tt: float, status: int, ra: Any) -> None:
                result.attempts.append(Attempt(-1, t - release, tt - release, status, ra))

            self.at(t + NET, lambda tt, _: self.request(tt, answered))

        for i in range(clients):
            self.at(release, attempt, i)
        if new_rate > 0:
            self.at(self.rng.expovariate(new_rate), new)
        return result


def _recorder(o: Outcome) -> Answer:
    def answered(t: float, status: int, ra: Any) -> None:
        o.done, o.status, o.retry_after = t, status, ra

    return answered


def open_figures(out: list[Outcome], start: float, end: float, timeout: float) -> dict[str, Any]:
    """An open loop's figures over requests sent in [start, end): offered and goodput (served within ``timeout``)
    per second, p99 of those served (s), the share timed out, and the 429s and 5xx."""
    window = [o for o in out if start <= o.sent < end]
    ok = sorted(o.done - o.sent for o in window if o.status == 200 and o.done - o.sent <= timeout)
    span = end - start
    return {"offered": len(window) / span, "goodput": len(ok) / span,
            "p99": ok[min(len(ok) - 1, int(0.99 * len(ok)))] if ok else None,
            "timeouts": sum(1 for o in window if o.done - o.sent > timeout) / max(1, len(window)),
            "r429": sum(1 for o in window if o.status == 429),
            "r5xx": sum(1 for o in window if o.status >= 500 and o.done - o.sent <= timeout)}  # fmt: skip


def closed_figures(out: list[Outcome], start: float, end: float) -> dict[str, Any]:
    """A closed loop's figures over requests sent in [start, end) and answered: served per second, and the rest."""
    window = [o for o in out if start <= o.sent < end and o.done < math.inf]
    served = sum(1 for o in window if o.status == 200)
    return {"rps": served / (end - start), "not_served": len(window) - served}
