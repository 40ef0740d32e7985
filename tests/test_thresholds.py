"""The thresholds file and its loader: typed, validated at the edge, named errors, overrides."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from holmes.calibration.thresholds import DEFAULT_PATH, SCHEMA, Thresholds, load_thresholds, threshold_names
from holmes.errors import ConfigError, ThresholdsError

ROOT = Path(__file__).resolve().parent.parent


def _write(tmp_path: Path, values: dict, schema: str = SCHEMA) -> Path:
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"schema": schema, "thresholds": values}))
    return f


def test_shipped_file_names_every_threshold_once():
    doc = json.loads(DEFAULT_PATH.read_text())
    assert doc["schema"] == SCHEMA
    assert list(doc["thresholds"]) == list(threshold_names())
    t = load_thresholds()
    assert isinstance(t, Thresholds) and t.as_dict() == doc["thresholds"]


def test_load_is_cached_per_path_and_immutable():
    t = load_thresholds()
    assert load_thresholds(DEFAULT_PATH) is t
    with pytest.raises(Exception):
        t.stretch_z = 1.0  # frozen
    assert load_thresholds(stretch_z=7).stretch_z == 7.0 and load_thresholds().stretch_z == t.stretch_z


def test_user_file_overrides_some_values(tmp_path):
    f = _write(tmp_path, {"stretch_z": 6, "cell_tail": "gpd"})
    t = load_thresholds(f)
    assert (t.stretch_z, t.cell_tail) == (6.0, "gpd")
    assert t.changed() == {"stretch_z": 6.0, "cell_tail": "gpd"}
    assert t.own_z == load_thresholds().own_z


@pytest.mark.parametrize("values, key", [({"strech_z": 5}, "unknown threshold 'strech_z'"),
                                         ({"stretch_z": "5"}, "stretch_z: Input should be a valid number"),
                                         ({"rate_lag": 1.5}, "rate_lag: Input should be a valid integer"),
                                         ({"follow_waits": 1}, "follow_waits: Input should be a valid boolean"),
                                         ({"cause_share": 2.0}, "cause_share: Input should be less than or equal to 1")])
def test_bad_file_names_file_and_key(tmp_path, values, key):
    f = _write(tmp_path, values)
    with pytest.raises(ThresholdsError) as exc:
        load_thresholds(f)
    assert str(f.resolve()) in str(exc.value) and key in str(exc.value)
    assert isinstance(exc.value, ConfigError) and isinstance(exc.value, ValueError)


def test_bad_schema_or_json_or_missing_file(tmp_path):
    with pytest.raises(ThresholdsError, match="schema must be 'holmes.thresholds/1'"):
        load_thresholds(_write(tmp_path, {}, schema="holmes.thresholds/0"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ThresholdsError, match="not a readable JSON file"):
        load_thresholds(bad)
    with pytest.raises(ThresholdsError, match="cannot read"):
        load_thresholds(tmp_path / "absent.json")


def test_docs_list_every_threshold():
    text = (ROOT / "docs" / "thresholds.md").read_text()
    missing = [k for k in threshold_names() if f"`{k}`" not in text]
    assert not missing


def test_calibration_does_not_import_localize():
    for path in (ROOT / "holmes" / "calibration").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith("holmes.localize") for n in names), path


def test_localize_params_keeps_at_most_20_knobs_and_routes_thresholds(tmp_path):
    from holmes.localize import LocalizeParams

    assert len(LocalizeParams.model_fields) <= 20
    assert not set(LocalizeParams.model_fields) & set(threshold_names())
    by_name, by_map = LocalizeParams(stretch_z=6), LocalizeParams(thresholds={"stretch_z": 6})
    by_file = LocalizeParams(thresholds=_write(tmp_path, {"stretch_z": 6}))
    assert by_name.t == by_map.t == by_file.t and by_name.t.stretch_z == 6.0
    assert by_name.to_json()["thresholds"] == {"stretch_z": 6.0}
    assert LocalizeParams().to_json()["thresholds"] == {}
    # a later override adds to the thresholds given before; a knob's value stays the user's
    q = by_name.replace(own_z=5, full_read=4)
    assert (q.t.stretch_z, q.t.own_z, q.full_read) == (6.0, 5.0, 4)
    assert LocalizeParams().full_read == load_thresholds().default_full_read
    assert LocalizeParams(thresholds={"default_full_read": 7}).full_read == 7
    with pytest.raises(ConfigError, match="stretch_z"):
        LocalizeParams(stretch_z="high")
    with pytest.raises(ConfigError, match="unknown parameter 'stretchz'"):
        LocalizeParams(stretchz=6)


def _hang_log(r: int, states: list[str]) -> object:
    from holmes.io.schema import ops_table

    n = len(states)
    return ops_table(rank=[r] * n, iteration=list(range(n)), op_index=[0] * n, comm_id=["dp-0"] * n,
                     seq=list(range(n)), op=["all_reduce"] * n, peer=[None] * n, nbytes=[8] * n,
                     start_ns=[10 * i for i in range(n)],
                     end_ns=[10 * i + 5 if s == "completed" else None for i, s in enumerate(states)], state=states)


def test_an_override_reaches_the_analysis():
    # rank 2 left no log while 0 and 1 wait in the all-reduce: its evidence score (the confidence
    # before calibration) is the threshold hang_conf_no_log
    import holmes
    from holmes.io import MemoryJob

    meta = {"world_size": 3, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1, 2]}}}
    c, s = "completed", "started"
    job = MemoryJob(meta, {0: _hang_log(0, [c, s]), 1: _hang_log(1, [c, s])})
    shipped = holmes.localize(job, analysis="hang").all_devices[0]
    moved = holmes.localize(job, analysis="hang", thresholds={"hang_conf_no_log": 0.8}).all_devices[0]
    assert shipped.id == moved.id == "gpu:2"
    assert shipped.evidence_score == pytest.approx(load_thresholds().hang_conf_no_log)
    assert moved.evidence_score == pytest.approx(0.8)


def test_a_fifo_given_as_thresholds_is_refused_not_read(tmp_path):
    import os

    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    with pytest.raises(ThresholdsError, match="t.json"):
        load_thresholds(fifo)
