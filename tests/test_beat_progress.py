"""The checks and bounds of a beat's Spark progress and history (nimbus.state.beat_progress),
and what a worker makes of Spark's progress (nimbus.worker.progress): every field typed,
every text and list bounded, a whole beat within its size, and a real progress through
both unchanged.
"""

from __future__ import annotations

import json

import pytest

from nimbus.state import beat_progress as bp
from nimbus.state.records import WorkerBeat
from nimbus.supervisor import status_input
from nimbus.worker import progress as wp

# A StreamingQueryProgress as PySpark 4 gives it (offsets as JSON text), with a state
# operator and a watermark (the shape of Spark's own JSON).
SPARK_PROGRESS = {
    "id": "0abb5ec3-c344-4cda-83bf-c5427ec99584", "runId": "e3a3", "name": "wc-1-1.main",
    "timestamp": "2026-11-27T14:33:19.412Z", "batchId": 7, "batchDuration": 1691,
    "numInputRows": 20, "inputRowsPerSecond": 20.0, "processedRowsPerSecond": 52.9,
    "durationMs": {"addBatch": 990, "commitOffsets": 56, "getBatch": 65,
                   "latestOffset": 66, "queryPlanning": 419, "triggerExecution": 1688,
                   "walCommit": 70},
    "eventTime": {"avg": "2026-11-27T14:33:10.000Z", "watermark": "2026-11-27T14:33:00.000Z"},
    "stateOperators": [{"operatorName": "stateStoreSave", "numRowsTotal": 4,
                        "numRowsUpdated": 2, "memoryUsedBytes": 90_000,
                        "numRowsDroppedByWatermark": 1, "customMetrics": {"x": 1}}],
    "sources": [{"description": "FileStreamSource[file:/tmp/in-<script>x]",
                 "startOffset": "null", "endOffset": '{"logOffset": 0}',
                 "latestOffset": "null", "numInputRows": 20, "inputRowsPerSecond": 0.0,
                 "processedRowsPerSecond": 0.6, "metrics": {}}],
    "sink": {"description": "FileSink[/tmp/out]", "numOutputRows": 20, "metrics": {}},
}


def test_a_real_progress_passes_the_supervisors_checks_unchanged():
    made = wp.full_progress(SPARK_PROGRESS)
    assert made == {
        "batch_id": 7, "timestamp": "2026-11-27T14:33:19.412Z",
        "sources": [{"description": "FileStreamSource[file:/tmp/in-<script>x]",
                     "start_offset": None, "end_offset": '{"logOffset": 0}',
                     "latest_offset": None, "num_input_rows": 20,
                     "input_rows_per_second": 0.0, "processed_rows_per_second": 0.6}],
        "sink": {"description": "FileSink[/tmp/out]", "num_output_rows": 20},
        "state_operators": [{"operator_name": "stateStoreSave", "num_rows_total": 4,
                             "num_rows_updated": 2, "memory_used_bytes": 90_000,
                             "num_rows_dropped_by_watermark": 1}],
        "watermark": "2026-11-27T14:33:00.000Z",
        "duration_ms": SPARK_PROGRESS["durationMs"]}
    assert bp.checked_progress(json.loads(json.dumps(made))) == made


def test_offsets_of_pyspark_3_are_json_values_and_kept_as_capped_text():
    progress = {**SPARK_PROGRESS, "sources": [{
        "description": "KafkaV2[Subscribe[t]]",
        "startOffset": {"t": {"0": 5, "1": 7}}, "endOffset": 12,
        "latestOffset": {"t": {str(p): p for p in range(400)}}}]}
    (source,) = wp.full_progress(progress)["sources"]
    assert source["start_offset"] == '{"t": {"0": 5, "1": 7}}'
    assert source["end_offset"] == "12"
    assert len(source["latest_offset"]) == bp.MAX_OFFSET_CHARS
    assert source["latest_offset"].endswith(bp.ELLIPSIS)


@pytest.mark.parametrize("raw", [None, 7, "x", [1], True])
def test_progress_that_is_no_object_is_none(raw):
    assert bp.checked_progress(raw) is None


def test_every_field_of_a_hostile_progress_is_typed_or_dropped():
    huge = "y" * 100_000
    checked = bp.checked_progress({
        "batch_id": True, "timestamp": ["t"], "watermark": "\ud800",
        "sources": [{"description": huge, "start_offset": {"a": 1}, "end_offset": huge,
                     "latest_offset": 5, "num_input_rows": float("nan"),
                     "input_rows_per_second": "fast", "processed_rows_per_second": 1e300,
                     "evil": {"deep": [1]}}] * 50 + ["not a source"],
        "sink": "a string", "state_operators": [{"operator_name": 7}] * 100,
        "duration_ms": {**{f"k{i}": i for i in range(100)}, "bad key!": 1, "x": "1"},
        "more": huge})
    assert checked["batch_id"] is None and checked["timestamp"] is None
    assert checked["watermark"] is None  # a lone surrogate: no reply could carry it
    assert len(checked["sources"]) == bp.MAX_SOURCES
    source = checked["sources"][0]
    assert set(source) == {"description", "start_offset", "end_offset", "latest_offset",
                           "num_input_rows", "input_rows_per_second",
                           "processed_rows_per_second"}
    assert len(source["description"]) == bp.MAX_DESCRIPTION_CHARS
    assert len(source["end_offset"]) == bp.MAX_OFFSET_CHARS
    assert (source["start_offset"], source["latest_offset"]) == (None, None)
    assert (source["num_input_rows"], source["input_rows_per_second"],
            source["processed_rows_per_second"]) == (None, None, None)
    assert checked["sink"] is None
    assert len(checked["state_operators"]) == bp.MAX_STATE_OPERATORS
    assert checked["state_operators"][0]["operator_name"] is None
    assert len(checked["duration_ms"]) == bp.MAX_DURATIONS
    assert "bad key!" not in checked["duration_ms"] and "more" not in checked


def test_history_keeps_the_newest_valid_points_in_time_order():
    good = [[1000 + 10 * i, 1.5, 2.0, 30] for i in range(200)]
    assert bp.checked_history(good) == good[-bp.HISTORY_POINTS:]
    assert bp.HISTORY_POINTS == 90
    mixed = [[100, 1, 1, 5], [90, 1, 1, 5], [110, -1, 1, 5], [120, 1, 1, None],
             [130, 1, 1, "slow"], [140, True, 1, 1], "x", [150, 1, 1], [160, 1, 1, 1, 1],
             [170.7, 0, 0, 0], [0, 1, 1, 1]]
    assert bp.checked_history(mixed) == [[100, 1, 1, 5], [120, 1, 1, None],
                                         [170, 0, 0, 0]]
    assert bp.checked_history({"points": []}) == []


@pytest.mark.parametrize("url", ["http://127.0.0.1:4040", "https://spark.example:4041/x?y=1",
                                 "HTTP://host"])
def test_spark_ui_addresses_that_are_http_urls_are_kept(url):
    assert bp.checked_url(url) == url


@pytest.mark.parametrize("url", [None, 4040, "", "javascript:alert(1)", "//host:4040",
                                 "ftp://host", "http://", "http://host:port",
                                 'http://h/"onmouseover="x', "http://h/<script>",
                                 "http://h/a b", "http://h/\n", "http://" + "h" * 600,
                                 "data:text/html,<script>x</script>", "http://\ud800"])
def test_other_spark_ui_addresses_are_dropped(url):
    assert bp.checked_url(url) == ""


def hostile_beat() -> dict:
    """As much as a worker can send that passes the checks: every component with the
    longest names, texts and lists, and a full history."""
    long = "z" * 10_000
    source = {"description": long, "start_offset": long, "end_offset": long,
              "latest_offset": long, "num_input_rows": 2 ** 40,
              "input_rows_per_second": 1.5e12, "processed_rows_per_second": 1.5e12}
    stats = {"batch_id": 2 ** 40, "num_input_rows": 2 ** 40,
             "input_rows_per_second": 1.0e15, "processed_rows_per_second": 1.0e15,
             "timestamp": "t" * 64, "pid": 2 ** 40, "input_waiting": True,
             "progress": {"batch_id": 1, "timestamp": long, "watermark": long,
                          "sources": [source] * 100,
                          "sink": {"description": long, "num_output_rows": 1},
                          "state_operators": [{"operator_name": long}] * 100,
                          "duration_ms": {f"d{i}": 10 ** 15 for i in range(100)}},
             "history": [[10 ** 9 + 10 * i, 1e15, 1e15, 1e15] for i in range(1000)]}
    return {"components": {f"{i:02d}" + "c" * 62: stats for i in range(500)},
            "spark_ui_url": "http://127.0.0.1:4040"}


def test_a_whole_beat_stays_within_its_bound_with_its_flat_fields_whole():
    checked = status_input.checked_beat(hostile_beat())
    assert len(checked.components) == status_input.MAX_BEAT_COMPONENTS
    beat = WorkerBeat(time_secs=1, topology_id="t" * 200 + "-1-1", supervisor_id="s" * 64,
                      host="h" * 255, port=6700, components=checked.components,
                      spark_ui_url=checked.spark_ui_url)
    encoded = beat.encode()
    assert len(encoded) <= bp.MAX_BEAT_BYTES
    assert WorkerBeat.decode(encoded).spark_ui_url == "http://127.0.0.1:4040"
    for stats in checked.components.values():
        assert stats["batch_id"] == 2 ** 40 and stats["input_waiting"] is True
    cut = [name for name, stats in checked.components.items() if stats.get("details_cut")]
    kept = [name for name, stats in checked.components.items() if stats.get("progress")]
    assert cut and kept, "some details fit, the rest is cut and says so"


def test_details_of_the_largest_components_go_first():
    small = {"batch_id": 1, "history": [[1000, 1, 1, 1]], "progress": bp.checked_progress({})}
    large = {"batch_id": 2, "history": [[1000 + i, 1, 1, 1] for i in range(90)],
             "progress": bp.checked_progress({})}
    components = {"small": small, "large": large}
    budget = len(json.dumps(components, sort_keys=True)) - 10
    fitted = bp.fit_components(components, budget)
    assert fitted["small"] == small
    assert fitted["large"]["history"] == [] and fitted["large"]["details_cut"] is True
    assert fitted["large"]["progress"] == large["progress"]
    assert components["large"]["history"], "the caller's dict is left as it was"


def test_a_beat_of_an_earlier_release_still_decodes():
    old = json.dumps({"format": 1, "time_secs": 5, "topology_id": "wc-1-1",
                      "supervisor_id": "s", "host": "h", "port": 6700,
                      "components": {"main": {"batch_id": 3, "num_input_rows": 1}}})
    beat = WorkerBeat.decode(old.encode())
    assert beat.spark_ui_url == "" and beat.components == {
        "main": {"batch_id": 3, "num_input_rows": 1}}


# -- the worker's side ---------------------------------------------------------------------
def at(secs: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(secs, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def batch(batch_id: int, secs: float, rate_in: float, rate_out: float, ms: int) -> dict:
    return {"batchId": batch_id, "timestamp": at(secs), "inputRowsPerSecond": rate_in,
            "processedRowsPerSecond": rate_out,
            "durationMs": {"addBatch": ms // 2, "triggerExecution": ms}}


def idle(batch_id: int, secs: float) -> dict:
    # What Spark reports for a trigger that found no data: no addBatch.
    return {"batchId": batch_id, "timestamp": at(secs), "inputRowsPerSecond": 0.0,
            "processedRowsPerSecond": 0.0, "durationMs": {"triggerExecution": 3}}


def test_history_is_one_point_per_ten_seconds_mean_rates_and_slowest_batch():
    history = wp.History()
    base = 1_800_000_000
    for i, (rate_in, rate_out, ms) in enumerate([(10, 20, 100), (30, 40, 500), (5, 6, 50)]):
        history.add(batch(i, base + 3 * i, rate_in, rate_out, ms))   # 0, 3, 6 s: one bucket
    history.add(batch(3, base + 12, 1, 2, 7))
    history.add(batch(4, base + 45, 1, 2, 8))   # buckets 20 and 30 without batches: a gap
    assert history.points(now=base + 50) == [
        [base, 15.0, 22.0, 500], [base + 10, 1.0, 2.0, 7], [base + 40, 1.0, 2.0, 8]]
    # The window: points older than 15 minutes go, and at most 90 are kept.
    assert history.points(now=base + 905) == [[base + 10, 1.0, 2.0, 7],
                                              [base + 40, 1.0, 2.0, 8]]
    for i in range(200):
        history.add(batch(10 + i, base + 100 + 10 * i, 1, 1, 1))
    points = history.points(now=base + 100 + 10 * 199)
    assert len(points) == bp.HISTORY_POINTS == 90
    assert bp.checked_history(points) == points


class FakeQuery:
    """lastProgress and recentProgress as a StreamingQuery gives them."""

    def __init__(self) -> None:
        self.all: list[dict] = []
        self.recent_reads = 0

    @property
    def lastProgress(self) -> dict | None:  # noqa: N802 - Spark's name
        return self.all[-1] if self.all else None

    @property
    def recentProgress(self) -> list[dict]:  # noqa: N802 - Spark's name
        self.recent_reads += 1
        return self.all[-100:]


def test_every_batch_counts_once_idle_triggers_never_and_missed_ones_are_caught_up():
    query, tracker = FakeQuery(), wp.QueryProgress()
    base = 1_800_000_000
    assert tracker.report(query, base)["batch_id"] == -1     # no batch yet
    query.all += [batch(0, base, 10, 10, 100)]
    first = tracker.report(query, base + 1)
    assert (first["batch_id"], first["history"]) == (0, [[base, 10.0, 10.0, 100]])
    reads = query.recent_reads
    # The same progress again, then an idle trigger (the next batch's id, no addBatch),
    # then that batch itself: counted once, no recentProgress read for any of them.
    tracker.report(query, base + 2)
    query.all.append(idle(1, base + 3))
    tracker.report(query, base + 3)
    query.all.append(batch(1, base + 4, 30, 30, 300))
    assert tracker.report(query, base + 5)["history"] == [[base, 20.0, 20.0, 300]]
    assert query.recent_reads == reads
    # Three batches between two beats: the two missed ones come from recentProgress.
    query.all += [batch(2, base + 11, 1, 1, 1), batch(3, base + 12, 3, 3, 9),
                  batch(4, base + 13, 5, 5, 5)]
    entry = tracker.report(query, base + 14)
    assert entry["history"] == [[base, 20.0, 20.0, 300], [base + 10, 3.0, 3.0, 9]]
    assert query.recent_reads == reads + 1
    assert entry["progress"]["batch_id"] == 4 and entry["input_rows_per_second"] == 5.0


def test_a_restarted_workers_history_continues_the_slots_earlier_one():
    base = 1_800_000_000
    earlier = [[base + 10 * i, 1.0, 1.0, 5] for i in range(10)]          # base .. base+90
    current = [[base + 90, 7.0, 7.0, 9], [base + 120, 7.0, 7.0, 9]]       # after a restart
    merged = bp.merge_history(earlier, current, now=base + 130)
    assert merged == earlier[:9] + current, "older points first, the same bucket once"
    assert bp.merge_history(earlier, [], now=base + 130) == earlier, "none yet: kept"
    assert bp.merge_history(earlier, current, now=base + 95 + bp.HISTORY_WINDOW_S) == \
        [p for p in earlier[:9] + current if p[0] >= base + 95]
    # Through the supervisor's checks: the slot's earlier points, then the worker's own.
    checked = status_input.checked_beat(
        {"components": {"main": {"batch_id": 3, "history": current + [["x"]]},
                        "other": {"batch_id": 1}}},
        earlier={"main": earlier, "gone": earlier}, now=base + 130)
    assert checked.components["main"]["history"] == earlier[:9] + current
    assert checked.histories == {"main": earlier[:9] + current}
    assert "history" not in checked.components["other"]
