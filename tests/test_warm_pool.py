"""WarmPool.take's rules, on stand-in handles (the real processes: test_warm_workers)."""

from __future__ import annotations

from pathlib import Path

from nimbus.supervisor.warm_pool import WAIT, WarmPool
from nimbus.worker_protocol.spec import WorkerSpec

DEFAULTS = {"topology.spark.master": "local[1]",
            "topology.spark.conf": {"spark.driver.memory": "512m"}}


class StandIn:
    def __init__(self, warm: str, code: int | None = None):
        self.warm = warm
        self.code = code

    def exit_code(self) -> int | None:
        return self.code

    def memory_bytes(self) -> int:
        return 100


def spec(n: int = 0, conf: dict | None = None) -> WorkerSpec:
    return WorkerSpec(topology_id=f"warm-{n}", port=0, supervisor_id="s", host="h",
                      code_dir="", lease_fd=-1, status_fd=-1,
                      conf=DEFAULTS if conf is None else conf)


def pool(*handles: StandIn) -> WarmPool:
    made = WarmPool(1, Path("/nonexistent"), ("true",), lambda n, r, w: spec(n),
                    env=dict, cgroups=None, start_timeout_s=90, wake=lambda: None)
    made._handles = list(handles)  # type: ignore[arg-type]
    made._specs = {id(h): spec() for h in handles}
    return made


def test_a_topology_with_other_settings_is_told_why_even_with_none_ready():
    wanted = spec(conf={**DEFAULTS, "topology.spark.conf": {"spark.driver.memory": "1g"}})
    assert pool().take(wanted) == (None, "Spark setting spark.driver.memory is 1g, the warm "
                                         "workers' 512m (fixed when Spark starts)")


def test_none_up():
    assert pool().take(spec()) == (None, "no warm worker ready")
    assert pool(StandIn("warming", code=1)).take(spec()) == (None, "no warm worker ready")


def test_a_starting_one_is_waited_for():
    starting = StandIn("warming")
    warm = pool(starting)
    assert warm.take(spec()) == (None, WAIT)
    assert warm._handles == [starting]


def test_a_starting_one_is_waited_for_by_one_slot_only():
    """Issue 20: a second slot does not wait for the warm worker the first one waits
    for (it would start cold only after that one was taken): it starts cold at once."""
    warm = pool(StandIn("warming"))
    assert warm.take(spec(), waiting_ahead=0) == (None, WAIT)
    assert warm.take(spec(), waiting_ahead=1) == (
        None, "the warm workers starting are each awaited by another slot")
    two = pool(StandIn("warming"), StandIn("warming"))
    assert two.take(spec(), waiting_ahead=1) == (None, WAIT)


def test_a_ready_one_is_taken_before_a_starting_one_and_leaves_the_pool():
    starting, ready = StandIn("warming"), StandIn("ready")
    warm = pool(starting, ready)
    assert warm.take(spec()) == (ready, "")
    assert ready.warm == "taken"
    assert warm._handles == [starting]
    assert (warm.summary().ready, warm.summary().starting, warm.summary().memory_bytes) == (
        0, 1, 100)
