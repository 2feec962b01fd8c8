"""The capacity search: the highest passing load level, found with a `measure(scale, is_repeat)`
that replays one level and judges it (`capacity.step.judge`); the definitions it searches for
are `capacity.step`'s.

The search runs on one running engine: exponential bracketing from a start level (k = 1, or an
earlier trial's capacity), then bisection (geometric midpoints) until the bracket is within the
precision. Then both ends of the bracket are measured again: a repeat that agrees confirms the
end; one that disagrees marks the result *unstable* and a third measurement decides by majority
(never an average); an end whose outcome changed resumes the search from there. A level is abandoned as soon as
its outcome is certain (more requests certainly missed than the target allows, over the whole window or
over its last third), so only passing levels pay their whole window. A failed level
whose client could not keep the schedule (`client_overloaded`) says nothing about the engine: it
is measured once more, and if the client falls behind again the search stops there and says so
(the capacity is then a lower bound). A failed level during which other work took the engine's
cores (`replay.machine`, `Step.machine_busy`) says nothing about the engine either: it is measured
again once the machine is quiet (`capacity.levels` waits), up to `BUSY_RETRIES` times; still busy,
the search stops there with verdict *machine_busy* (a lower bound, never the configuration's
capacity). A level that passed while the machine was busy counts: the engine held the load with
fewer cores.

Early stop (`prune_at`): where a tuner already knows a configuration at least as good on every other
objective that passes level L, a new configuration that fails L (confirmed by a repeat, or a clear
fail under the guided rules) cannot be on the front; its search ends there with verdict *pruned* and
the bracket it has, [highest pass, L].

Rules (`CapacityOptions.rules`): "guided" (the default) places each level where the model of
`capacity.response` says the SLO is crossed (bracketing and bisection as above where it cannot
say) and repeats a bracket end, or a pruning fail, only where its outcome is marginal
(`capacity.response.repeat_rule`, named on the level); "classic" doubles, bisects at the geometric
midpoint and repeats both ends and every pruning fail, as tracetune did before.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from tracetune.capacity import response
from tracetune.capacity.step import CapacityOptions, CapacityResult, Step, Verdict

Measure = Callable[[float, bool], Step]  # (scale, is_repeat) -> Step
BUSY_RETRIES = 2  # a level failed on a busy machine is measured at most this many times more


class _Search:
    """The state of one search: every level's outcome (a confirmed level's majority vote), and
    the levels that measured the client instead of the engine."""

    def __init__(self, measure: Measure, options: CapacityOptions) -> None:
        self.measure, self.options = measure, options
        self.steps: list[Step] = []
        self.outcome: dict[float, bool] = {}
        self.overloaded: list[Step] = []
        self.busy: list[Step] = []  # failed on a busy machine, every retry too: the search stops
        self.unstable = False
        self.verdict: Verdict = Verdict.OK
        self.bisect_next = False  # the last model-placed level did not halve the bracket

    @property
    def hi(self) -> float | None:
        """The lowest failing level."""
        return min((k for k, ok in self.outcome.items() if not ok), default=None)

    @property
    def lo(self) -> float | None:
        """The highest passing level below the lowest failing one."""
        hi = self.hi
        return max((k for k, ok in self.outcome.items() if ok and (hi is None or k < hi)), default=None)

    @property
    def stopped(self) -> bool:
        """The last level measured the client or the machine, again when retried: the search ends."""
        return bool(self.overloaded or self.busy)

    def add(self, step: Step) -> None:
        if step.machine_busy and not step.passed:  # a busy machine also starves the client: it comes first
            self.busy.append(step)
        elif step.client_overloaded and not step.passed:
            self.overloaded.append(step)
        else:
            self.outcome[step.scale] = step.passed

    @property
    def guided(self) -> bool:
        return self.options.rules == "guided"

    def run(self, scale: float, repeat: bool = False, retry: bool = True, placed_by: str = "") -> Step:
        step = self.measure(scale, repeat)
        step.placed_by = "repeat" if repeat else placed_by
        self.steps.append(step)
        if retry and step.client_overloaded and not step.passed and not repeat and not step.machine_busy:
            # A failure the client may have caused says nothing yet: measure the level once more.
            step = self.measure(scale, False)
            step.placed_by = "client retry"
            self.steps.append(step)
        for _ in range(BUSY_RETRIES):
            if not (step.machine_busy and not step.passed):
                break
            step = self.measure(scale, repeat)  # the levels wait for a quiet machine first
            step.placed_by = "busy retry"
            self.steps.append(step)
        return step

    def next_scale(self) -> tuple[float, str]:
        """Where the next level goes while bracketing or bisecting, and the rule that put it there."""
        lo, hi = self.lo, self.hi
        if not self.guided:
            if lo is not None and hi is not None:
                return math.sqrt(lo * hi), "bisection"
            return (lo * 2, "doubling") if lo is not None else ((hi or self.options.start_scale) / 2, "halving")
        prediction = response.predict(self.steps)
        scale, rule = response.place(lo, hi, prediction, self.options.precision, bisect=self.bisect_next)
        self.bisect_next = False
        return scale, rule

    def placed(self, rule: str, width: float) -> None:
        """After a model-placed level: the next bisects when this one did not halve the bracket."""
        lo, hi = self.lo, self.hi
        if rule == "model" and lo is not None and hi is not None and math.isfinite(width):
            self.bisect_next = math.log(hi / lo) > width / 2

    def width(self) -> float:
        lo, hi = self.lo, self.hi
        return math.log(hi / lo) if lo is not None and hi is not None else math.inf

    def budget_left(self) -> bool:
        if len(self.steps) >= self.options.max_steps:
            self.verdict = Verdict.MAX_STEPS
            return False
        return True

    def bracket(self, scale: float | None) -> None:
        """Double (or halve; guided: step to the model's prediction) until one level passes and a
        higher one fails, starting at `scale` (None: wherever the rule places it). Going down stops
        early when two failing levels in a row did not raise the attainment: the misses do not come
        from the load (e.g. bursts of the trace the config cannot serve within the SLO at any rate)."""
        flat = 0
        while not self.stopped and (self.lo is None or self.hi is None) and self.budget_left():
            lo, hi = self.lo, self.hi
            rule = "start"
            if scale is None or (lo is not None and scale <= lo) or (hi is not None and scale >= hi):
                scale, rule = self.next_scale()
                scale = self._within_range(scale)
            if scale > self.options.max_scale or scale < self.options.min_scale:
                self.verdict = Verdict.ABOVE_MAX if scale > self.options.max_scale else Verdict.BELOW_MIN
                return
            before = self._attainment_above(scale)
            step = self.run(scale, placed_by=rule)
            self.add(step)
            if not step.passed and before is not None and step.attainment <= before + 1.0 / max(step.planned, 1):
                flat += 1
                if flat >= 2:
                    self.verdict = Verdict.LOAD_INDEPENDENT
                    return
            else:
                flat = 0
            scale = None

    def _within_range(self, scale: float) -> float:
        """A placed level beyond the search's range at the range's end, where that end is not yet
        measured (a model's step past it must not end the search unmeasured)."""
        o = self.options
        measured = {s.scale for s in self.steps}
        if not self.guided:
            return scale
        if scale < o.min_scale and o.min_scale not in measured and (self.hi is None or o.min_scale < self.hi):
            return o.min_scale
        if scale > o.max_scale and o.max_scale not in measured and (self.lo is None or o.max_scale > self.lo):
            return o.max_scale
        return scale

    def _attainment_above(self, scale: float) -> float | None:
        """The last measured attainment of the lowest failed level above `scale` (None: none failed
        above it)."""
        above = [s for s in self.steps if s.scale > scale * (1 + 1e-9) and not s.passed]
        if not above:
            return None
        lowest = min(s.scale for s in above)
        return [s.attainment for s in above if math.isclose(s.scale, lowest)][-1]

    def bisect(self) -> None:
        """Levels inside the bracket (geometric midpoints; guided: where the model puts the crossing)
        until the bracket is within the precision."""
        while (not self.stopped and self.lo is not None and self.hi is not None
               and self.hi / self.lo - 1 > self.options.precision + 1e-9 and self.budget_left()):
            width = self.width()
            scale, rule = self.next_scale()
            self.add(self.run(scale, placed_by=rule))
            self.placed(rule, width)

    def prune(self, level: float) -> bool:
        """True when the configuration fails `level` (or a lower level already failed), confirmed
        by a repeat: it is below a configuration that passes there, and the search stops. False,
        measuring nothing, once the seeds measured the client or a busy machine (the search ends)."""
        if self.stopped:
            return False
        failed = [k for k, ok in self.outcome.items() if not ok and k <= level]
        if any(ok and k >= level for k, ok in self.outcome.items()):
            return False
        if failed:
            scale = max(failed)
        else:
            step = self.run(level, placed_by="prune")
            self.add(step)
            if step.passed or self.stopped:
                return False
            scale = level
        if self.options.confirm and self.needs_repeat(scale) and self.confirm(scale):
            return False  # the failure did not hold up: search as usual
        self.verdict = Verdict.PRUNED
        return True

    def needs_repeat(self, scale: float) -> bool:
        """Classic: always. Guided: where the level's outcome is marginal (`capacity.response.repeat_rule`);
        the rule is named on the level."""
        last = [s for s in self.steps if math.isclose(s.scale, scale) and not s.not_counted]
        if not self.guided or not last:
            return True
        needed, why = response.repeat_rule(last[-1], self.options.attainment)
        last[-1].repeat_rule = why
        return needed

    def confirm(self, scale: float) -> bool:
        """Measure a boundary level again; on disagreement a third time, the majority decides and
        the result is flagged unstable. True when the level's outcome changed."""
        first = self.outcome[scale]
        votes = [first]
        while len(votes) < 2 or (len(votes) == 2 and votes[1] != first):
            step = self.run(scale, repeat=True)
            if step.not_counted:  # measured the client or the machine again: the search ends here
                self.add(step)
                return False
            votes.append(step.passed)
        self.unstable = self.unstable or len(votes) == 3
        self.outcome[scale] = votes.count(True) >= 2
        return self.outcome[scale] != first


def search_capacity(measure: Measure, options: CapacityOptions, *, seed_steps: Sequence[Step] = (),
                    gpus: int = 1, base_rates: tuple[float, float] = (0.0, 0.0), prune_at: float | None = None,
                    seeds_only: bool = False, clock: Callable[[], float] = time.perf_counter) -> CapacityResult:
    """Find the highest passing level with `measure`; `seed_steps` are levels already measured on
    this engine (e.g. the trace's own rate), reused instead of measured again. Both ends of the
    final bracket are measured again (see `_Search.confirm`); a changed outcome resumes the search.
    `prune_at`: stop early, verdict "pruned", when the configuration fails that level (`_Search.prune`).
    `seeds_only`: the caller knows the configuration cannot be on the front whatever its capacity (e.g.
    outside the quality gate): no level beyond the seeds (those measured again included), verdict
    "pruned", the bracket the seeds left (a passing seed's capacity is a lower bound)."""
    t0 = clock()
    search = _Search(measure, options)
    search.steps.extend(seed_steps)
    for step in seed_steps:
        if step.machine_busy:  # its numbers are the trial's objectives: measured again on a quiet machine
            search.add(search.run(step.scale, retry=False, placed_by="busy retry"))
        elif step.client_overloaded and not step.passed:  # the client may have failed it: measured once more
            search.add(search.run(step.scale, retry=False))
        else:
            search.add(step)
    if seeds_only:
        search.verdict = Verdict.PRUNED
    elif prune_at is None or not search.prune(prune_at):
        _search(search, options)
    return _result(search, options, gpus, base_rates, clock() - t0)


def _search(search: _Search, options: CapacityOptions) -> None:
    """Bracket, bisect, confirm both ends; again from where an end's outcome changed."""
    confirmed: set[float] = set()
    scale: float | None = options.start_scale
    while True:
        search.bracket(scale)
        search.bisect()
        ended = (Verdict.BELOW_MIN, Verdict.MAX_STEPS, Verdict.LOAD_INDEPENDENT)
        if search.stopped or not options.confirm or search.verdict in ended:
            break
        ends = [k for k in (search.lo, search.hi) if k is not None and k not in confirmed]
        changed = False
        for end in ends:
            confirmed.add(end)
            changed = (search.needs_repeat(end) and search.confirm(end)) or changed
        if not changed:
            break
        search.verdict = Verdict.OK
        if search.guided:
            scale = None
        else:
            scale = (search.lo or options.start_scale) * 2 if search.hi is None else search.hi / 2


def _result(search: _Search, options: CapacityOptions, gpus: int, base_rates: tuple[float, float],
            search_s: float) -> CapacityResult:
    hi = search.hi
    if search.stopped:
        search.verdict = Verdict.MACHINE_BUSY if search.busy else Verdict.CLIENT_OVERLOADED
        hi = min([s.scale for s in (*search.overloaded, *search.busy)] + ([hi] if hi is not None else []))
    lo = max((k for k, ok in search.outcome.items() if ok and k < hi), default=None) if hi is not None else search.lo
    return CapacityResult(
        attainment_target=options.attainment, precision=options.precision, slos=[str(s) for s in options.slos],
        steps=search.steps, capacity_scale=lo, bracket_high=hi, base_rps=base_rates[0],
        base_output_tps=base_rates[1], gpus=gpus, unstable=search.unstable, verdict=search.verdict,
        search_s=search_s)
