"""A model's capture plans: which capture sets run on ONNX Runtime, built off the request path.

Every hooked forward-only capture asks `plan_for` first. A capture set (layers, capture side,
sample shape) seen `after` times (once, for a data-set job's chunks) gets a plan built on a
background thread (one build at a time per model), while the eager hooked lanes keep serving it;
once built and checked, the set's later batches run on the plan. Plans live in a least-recently-used
cache of `limit` entries. A set whose plan cannot be built is remembered with the reason (INFO's
`capture_plans.fallbacks`) and stays eager. The cache belongs to one load of one model: `close()`
(the model removed or reloaded) drops every plan, and a build still running then is thrown away
when it ends.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from service.errors import first_line
from service.introspection.nodes import NodeGraph
from service.registry.capture_graph import CapturePlan, PlanKey, PlanRefused, build_node_plan, build_plan
from service.specs.vocab import Capture, Reduce

log = logging.getLogger("hookserve.plans")
REMEMBERED = 256  # capture sets whose sightings and refusals are kept (the oldest forgotten first)


@dataclass(frozen=True)
class PlanSettings:
    limit: int = 4  # plans kept per model; 0: no plans
    after: int = 3  # batches of one capture set before its plan is built


class CapturePlans:
    """One loaded model's plans; `reason` (when set) says why it never gets any."""

    def __init__(
        self,
        module: nn.Module | None,
        settings: PlanSettings,
        reason: str = "",
        *,
        channels_last: bool = False,
        wide_threads: int = 1,
        name: str = "",
        on_build_thread: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.reason = reason or ("capture_plans = 0" if settings.limit <= 0 else "")
        self._module = module if not self.reason else None
        self._channels_last = channels_last
        self._wide_threads = wide_threads
        self._name = name
        self._on_build_thread = on_build_thread  # the runtime names the OS thread and pins it to one core
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._plans: OrderedDict[PlanKey, CapturePlan] = OrderedDict()
        self._seen: OrderedDict[PlanKey, int] = OrderedDict()
        self._refused: OrderedDict[PlanKey, PlanRefused] = OrderedDict()
        self._building: set[PlanKey] = set()
        self.forwards: Counter[str] = Counter()  # "plan" / "eager": capture batches by engine
        self.evicted = 0
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self._module is not None

    def plan_for(
        self,
        layers: list[str],
        capture: Capture,
        x: Tensor,
        *,
        at_once: bool = False,
        learn: bool = True,
        nodes: NodeGraph | None = None,
        reduce: Reduce | None = None,
    ) -> CapturePlan | None:
        """The plan for this batch's capture set, or None (the batch runs eager: counted, a build may start).

        `at_once`: bulk work (a data-set job) repeats the set many times, so its first sighting starts the build.
        `learn=False`: the set is the union of several requests' sets, which few batches repeat: it uses a plan
        already there but never starts one (each mix would otherwise build and evict plans of its own).
        `nodes`: `layers` are nodes of this node graph (their outputs), not modules.
        `reduce`: every request of the batch reduces every capture so (`mean`, `max`: done inside the plan's graph,
        which hands over [N, C] rather than whole maps; a plan of its own)."""
        if self._module is None:
            self.forwards["eager"] += 1
            return None
        key = PlanKey.of(layers, capture, x.shape[1:], nodes=nodes is not None, reduce=reduce)
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None and plan.accepts(x):
                self._plans.move_to_end(key)
                self.forwards["plan"] += 1
                return plan
            self.forwards["eager"] += 1
            if not learn or plan is not None or key in self._refused or key in self._building:
                return None
            seen = self._seen.pop(key, 0) + 1
            if seen < (1 if at_once else self.settings.after):
                self._seen[key] = seen
                while len(self._seen) > REMEMBERED:
                    self._seen.popitem(last=False)
                return None
            self._building.add(key)
        thread = threading.Thread(
            target=self._build, args=(key, nodes), name=f"hookserve-plans-{self._name}", daemon=True
        )
        thread.start()
        return None

    def _build(self, key: PlanKey, nodes: NodeGraph | None) -> None:
        self._on_build_thread()
        try:
            with self._build_lock:
                module = self._module
                if module is None:  # closed while this build waited for the one before it
                    self._finish(key)
                    return
                if nodes is not None:
                    plan = build_node_plan(nodes, key, self._channels_last, self._wide_threads)
                else:
                    plan = build_plan(module, key, self._channels_last, self._wide_threads)
        except PlanRefused as refused:
            log.info("%s: capture plan for %s not built: %s", self._name, key.describe(), refused.reason)
            self._finish(key, refused=refused)
        except Exception as exc:  # anything unforeseen keeps the set eager, with the reason shown
            log.warning("%s: capture plan for %s failed", self._name, key.describe(), exc_info=exc)
            self._finish(key, refused=PlanRefused(f"building it failed ({first_line(exc)})", "error"))
        else:
            log.info("%s: capture plan built for %s", self._name, key.describe())
            self._finish(key, plan=plan)

    def _finish(self, key: PlanKey, plan: CapturePlan | None = None, refused: PlanRefused | None = None) -> None:
        with self._lock:
            self._building.discard(key)
            if self._closed:
                return
            if refused is not None:
                self._refused[key] = refused
                while len(self._refused) > REMEMBERED:
                    self._refused.popitem(last=False)
            if plan is not None:
                self._plans[key] = plan
                while len(self._plans) > self.settings.limit:
                    self._plans.popitem(last=False)
                    self.evicted += 1

    def close(self) -> None:
        """Drop every plan (the model is going away); a build still running is discarded when it ends."""
        with self._lock:
            self._closed = True
            self._module = None
            self._plans.clear()
            self._seen.clear()

    @property
    def size(self) -> int:
        """Plans held now."""
        return len(self._plans)

    def refusals(self) -> list[tuple[PlanKey, PlanRefused]]:
        with self._lock:
            return list(self._refused.items())

    def info(self) -> dict[str, object]:
        """What INFO shows: the settings, the plans (most recently used last) and the capture sets left eager."""
        with self._lock:
            plans = [key.describe() | {"forwards": plan.forwards} for key, plan in self._plans.items()]
            refused = [key.describe() | {"reason": r.reason} for key, r in self._refused.items()]
            building = len(self._building)
        return {
            "enabled": self.enabled,
            "reason": self.reason or None,
            "limit": self.settings.limit,
            "after_requests": self.settings.after,
            "plans": plans,
            "building": building,
            "fallbacks": refused,
            "planned_forwards": self.forwards["plan"],
            "eager_forwards": self.forwards["eager"],
            "evicted": self.evicted,
        }
