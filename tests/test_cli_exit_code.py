"""``holmes localize --exit-code``: the verdict as the exit status (0 healthy, 1 culprit or hang, 3 inconclusive)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from holmes.cli.localize_cmd import VERDICT_EXIT, exit_status
from holmes.cli.main import main
from holmes.io import write_job
from holmes.io.schema import ops_table

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _verdict(capsys) -> str:
    return json.loads(capsys.readouterr().out)["verdict"]


def _sim(tmp_path, fault: str) -> Path:
    from holmes.simulate import simulate

    return simulate(tmp_path / "job", tp=2, pp=2, dp=2, iterations=20, seed=3, faults=[fault])


def test_the_mapping_covers_every_verdict():
    assert VERDICT_EXIT == {"healthy": 0, "culprit": 1, "hang": 1, "inconclusive": 3}
    with pytest.raises(KeyError):
        exit_status("unknown")


def test_culprit_exits_1_only_with_the_flag(tmp_path, capsys):
    job = _sim(tmp_path, "gpu:5@persistent*3")
    assert main(["localize", str(job), "--format", "json", "-q"]) == 0
    assert _verdict(capsys) == "culprit"
    assert main(["localize", str(job), "--format", "json", "-q", "--exit-code"]) == 1
    assert _verdict(capsys) == "culprit"


def test_healthy_exits_0():
    path = FIXTURES / "gpu16-clean"
    if not (path / "job.json").is_file():
        pytest.skip("fixture gpu16-clean not present")
    assert main(["localize", str(path), "-q", "--exit-code"]) == 0


def _log(r: int, states: list[str], comm: str) -> pa.Table:
    n = len(states)
    return ops_table(rank=[r] * n, iteration=list(range(n)), op_index=[0] * n, comm_id=[comm] * n,
                     seq=list(range(n)), op=["all_reduce"] * n, peer=[None] * n, nbytes=[8] * n,
                     start_ns=[10 * i for i in range(n)],
                     end_ns=[10 * i + 5 if s == "completed" else None for i, s in enumerate(states)], state=states)


def test_hang_exits_1(tmp_path, capsys):
    # rank 2 never entered the second all_reduce that ranks 0 and 1 are stuck in
    meta = {"world_size": 3, "communicators": {"dp-0": {"kind": "dp", "ranks": [0, 1, 2]}},
            "dump": {"reason": "signal", "at_ns": 1_000}}
    c, s = "completed", "started"
    job = write_job(tmp_path / "hung", meta, {0: _log(0, [c, s], "dp-0"), 1: _log(1, [c, s], "dp-0"),
                                              2: _log(2, [c], "dp-0")})
    assert main(["localize", str(job), "--format", "json", "-q", "--exit-code"]) == 1
    assert _verdict(capsys) == "hang"


def test_inconclusive_exits_3(tmp_path, capsys):
    # a pivot whose seq numbers are shifted against its groups': the logs disagree, no confident device
    job = _sim(tmp_path, "gpu:5@persistent*3")
    f = job / "ranks" / "rank-00000.parquet"
    t = pq.read_table(f)
    t = t.set_column(t.schema.get_field_index("seq"), "seq", pc.add(t.column("seq"), pa.scalar(1000, pa.int64())))
    pq.write_table(t, f)
    assert main(["localize", str(job), "--format", "json", "-q", "--exit-code"]) == 3
    assert _verdict(capsys) == "inconclusive"


def test_bad_input_stays_2(tmp_path, capsys):
    assert main(["localize", str(tmp_path / "missing"), "--exit-code"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
