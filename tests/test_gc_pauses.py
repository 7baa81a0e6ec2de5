"""Garbage collection pauses exported by the nimbus's /metrics."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nimbus.gc_pauses import PAUSE_BUCKETS, GcPauseCollector, GcPauses, recorder
from nimbus.metrics import NimbusMetrics
from nimbus.state.cluster_snapshot import ClusterSnapshot


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry).decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def full_count(samples: dict) -> float:
    return samples[("nimbus_gc_pause_seconds_count", (("generation", "2"),))]


def test_each_full_collection_is_counted_once_with_its_time():
    registry = CollectorRegistry()
    registry.register(GcPauseCollector(recorder()))
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between: the count is exact
    try:
        before = scrape(registry)
        gc.collect()
        gc.collect()
        after = scrape(registry)
    finally:
        if was_enabled:
            gc.enable()
    assert full_count(after) - full_count(before) == 2
    key = ("nimbus_gc_pause_seconds_sum", (("generation", "2"),))
    assert after[key] > before[key]
    buckets = [after[("nimbus_gc_pause_seconds_bucket", (("generation", "2"), ("le", le)))]
               for le in (*[repr(b) for b in PAUSE_BUCKETS], "+Inf")]
    assert buckets == sorted(buckets), "buckets are cumulative"
    assert buckets[-1] == full_count(after)


def test_the_hook_is_installed_once_per_process():
    recorder()
    recorder()
    assert sum(1 for callback in gc.callbacks
               if getattr(callback, "__self__", None) is recorder()) == 1


def test_the_nimbus_registry_exports_the_pauses_of_every_generation():
    metrics = NimbusMetrics("localfs", is_leader=lambda: False, snapshot=ClusterSnapshot)
    samples = scrape(metrics.registry)
    assert {g for (name, labels) in samples if name == "nimbus_gc_pause_seconds_count"
            for _, g in labels} == {"0", "1", "2"}
    # Never the frozen object count: gc.get_freeze_count() walks every frozen object.
    assert not [name for name, _ in samples if "frozen" in name]


def test_a_collection_that_began_before_the_hook_is_not_timed():
    pauses = GcPauses()
    pauses.on_collection("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
    assert pauses.buckets[2] == [0] * (len(PAUSE_BUCKETS) + 1)
    assert pauses.seconds[2] == 0.0
