"""Full-job work on Dask (issue #18): the same results as in process, bit for bit; a lost worker.

The exact merge of job contexts needs no Dask; the rest starts one 2-process ``LocalCluster``
for the module (skipped without ``distributed``: ``pip install holmes-localize[dask]``).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import holmes
from holmes.cli.main import main as cli
from holmes.detect import JobContext, job_context, jobs_dataset, load_default_detector, score_job, write_scores
from holmes.errors import ConfigError
from holmes.io import MemoryJob
from holmes.parallel import InProcess, ParallelError, get_executor

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "fixtures" / "gpu16-clean"


@functools.lru_cache(maxsize=1)
def _tables() -> tuple:
    job = holmes.read_job(JOB)
    return tuple(job.ops(r) for r in job.available_ranks())


def _same_context(a: JobContext, b: JobContext) -> bool:
    return a.n_ranks == b.n_ranks and all(np.array_equal(a.features(t).view(np.int32), b.features(t).view(np.int32))
                                          for t in _tables()[::5])


@settings(max_examples=8, deadline=None)
@given(st.permutations(list(range(16))), st.sets(st.integers(1, 15), max_size=5), st.randoms(use_true_random=False))
def test_context_merge_is_exact_whatever_the_tree(order, cuts, rnd):
    """Contexts of any groups of ranks, merged in any order and grouping, are the sequential one bit for bit."""
    tables = _tables()
    whole = JobContext.from_tables(tables)
    bounds = [0, *sorted(cuts), 16]
    parts = [JobContext.from_tables([tables[r] for r in order[a:b]]) for a, b in zip(bounds[:-1], bounds[1:])]
    while len(parts) > 1:  # merge two random parts until one is left
        i, j = sorted(rnd.sample(range(len(parts)), 2))
        b = parts.pop(j)
        parts[i] = JobContext.merged([parts[i], b]) if rnd.random() < 0.5 else parts[i].merge(b)
    assert _same_context(parts[0], whole)


def test_pickled_context_scores_the_same():
    import pickle

    ctx = JobContext.from_tables(_tables())
    t = _tables()[3]
    before = ctx.features(t)
    assert np.array_equal(pickle.loads(pickle.dumps(ctx)).features(t), before)


def test_import_holmes_does_not_import_dask():
    code = ("import sys, holmes, holmes.detect, holmes.parallel, holmes.cli.detect_cmd; "
            "print(any(m == 'dask' or m.startswith(('dask.', 'distributed')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_executor_choice_and_errors(monkeypatch):
    assert isinstance(get_executor(None), InProcess)
    ex = InProcess()
    assert get_executor(ex) is ex
    with pytest.raises(ConfigError, match="scheduler must be"):
        get_executor(8786)
    monkeypatch.setitem(sys.modules, "distributed", None)  # not installed
    with pytest.raises(ConfigError, match=r"holmes-localize\[dask\]"):
        get_executor("tcp://127.0.0.1:1")


def test_write_scores_names_a_rank_with_other_columns(tmp_path):
    tables = [t.append_column("score", t.column("end_ns")) for t in _tables()[:2]]
    tables[1] = tables[1].drop_columns(["peer"])
    with pytest.raises(ConfigError, match=r"rank 1: column\(s\) \['peer'\]"):
        write_scores(tables, tmp_path / "x.parquet")


# ---------------------------------------------------------------------------------------- on a cluster
@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    import dask

    # one lost worker per task is retried; a task that loses its worker twice fails the run
    with dask.config.set({"distributed.scheduler.allowed-failures": 1, "distributed.logging.distributed": "error"}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=":0")
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@functools.lru_cache(maxsize=1)
def _reference() -> list:
    return list(score_job(JOB))


def _equal_tables(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.equals(y) for x, y in zip(a, b))


def test_score_job_on_dask_is_the_in_process_result(client):
    scores = score_job(JOB, scheduler=client)
    got = list(scores)
    want = _reference()
    assert _equal_tables(got, want)
    assert scores.n_flagged == sum(int(t.column("flagged").to_numpy().sum()) for t in want)
    assert _same_context(job_context(JOB, scheduler=client), job_context(JOB))


def test_cli_detect_and_train_with_scheduler(client, tmp_path, capsys):
    addr = client.scheduler.address
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    assert cli(["detect", str(JOB), "--ranks", "0-5,9", "--out", str(a)]) == 0
    assert cli(["detect", str(JOB), "--ranks", "0-5,9", "--out", str(b), "--scheduler", addr]) == 0
    assert "7 rank(s)" in capsys.readouterr().err
    assert pq.read_table(a).to_pydict() == pq.read_table(b).to_pydict()
    X0, y0, g0 = jobs_dataset([JOB, JOB], max_ranks=6, seed=3)
    X1, y1, g1 = jobs_dataset([JOB, JOB], max_ranks=6, seed=3, scheduler=client)
    assert np.array_equal(X0.view(np.int32), X1.view(np.int32)) and np.array_equal(y0, y1) and np.array_equal(g0, g1)


def _ranks_of_task(ranks: list) -> list:
    return list(ranks)


def test_map_streams_small_chunks_a_bounded_number_ahead(client):
    from holmes.parallel import DaskExecutor

    ex = DaskExecutor(client, in_flight=3, max_chunk=4)
    assert DaskExecutor(client).in_flight == 2 * ex.workers + 1 and DaskExecutor(client).max_chunk == 64
    assert ex._chunk(8192, None, 8, ex.max_chunk) == 4 and DaskExecutor(client)._chunk(8192, None, 8, 64) == 64
    base = set(client.futures)
    got, ahead = [], []
    for part in ex.map(_ranks_of_task, range(202)):  # 202 / (8 x 2 workers): 13 a task, capped at 4
        got.append(part)
        ahead.append(len(set(client.futures) - base))  # this map's futures still on the cluster
    assert [len(p) for p in got] == [4] * 50 + [2] and sum(got, []) == list(range(202))
    assert max(ahead) <= 3 + 1  # in_flight, and the consumed one (Future.release runs on the client's loop)
    for _ in range(200):  # every future released once the map is consumed
        if not set(client.futures) - base:
            break
        time.sleep(0.05)
    assert not set(client.futures) - base


def test_an_in_memory_job_cannot_go_to_a_cluster(client):
    mem = MemoryJob(holmes.read_job(JOB).meta, {0: _tables()[0]})
    with pytest.raises(ConfigError, match="in-memory job"):
        score_job(mem, scheduler=client)


def _killing_detector(marker: Path, always: bool):
    """The shipped detector, but scoring kills its worker process (once, or every time)."""
    det = load_default_detector()

    class Killer:  # defined here: pickled by value to the workers
        threshold = det.threshold

        def uses_context(self) -> bool:
            return True

        def predict_proba_ops(self, ops, **kw):
            if always or not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            return det.predict_proba_ops(ops, **kw)

    return Killer()


def test_a_worker_killed_mid_run_gives_the_same_result(client, tmp_path):
    got = list(score_job(JOB, _killing_detector(tmp_path / "killed", always=False), scheduler=client))
    assert (tmp_path / "killed").exists()  # a worker did die
    assert _equal_tables(got, _reference())


def test_workers_killed_again_and_again_fail_with_a_clear_error(client, tmp_path):
    with pytest.raises(ParallelError, match="Dask cluster failed"):
        list(score_job(JOB, _killing_detector(tmp_path / "killed", always=True), ranks=[0, 1], context=None,
                       scheduler=client))


def test_persistent_analysis_on_dask_is_the_in_process_report(client, capsys):
    from holmes.localize.mapreduce import localize_persistent

    got = localize_persistent(JOB, scheduler=client).to_json()
    want = holmes.localize(JOB, analysis="persistent").to_json()
    got.pop("bytes_read"), want.pop("bytes_read")  # the bytes this process read: the workers read the logs
    assert got == want
    assert cli(["localize", str(JOB), "--analysis", "irregular", "--scheduler", client.scheduler.address]) == 2
    assert "--analysis persistent" in capsys.readouterr().err


@pytest.fixture(scope="module")
def slow_job(tmp_path_factory):
    from holmes.simulate import simulate

    # 128 GPUs x 40 iterations (the replays run on 32 of them), a GPU 1.3x slow from iteration 0
    out = tmp_path_factory.mktemp("persistent") / "job"
    simulate(out, tp=2, pp=4, dp=16, micro_batches=2, iterations=40, seed=11, faults=["gpu:77@persistent:0-39*1.3"])
    return out


def test_persistent_analysis_of_a_slow_gpu_on_dask_is_the_in_process_report(client, slow_job, capsys):
    import json

    from holmes.localize.mapreduce import localize_persistent

    want = holmes.localize(slow_job, analysis="persistent").to_json()
    got = localize_persistent(slow_job, scheduler=client).to_json()
    for r in (got, want):
        r.pop("bytes_read"), r.pop("timing", None)
    assert got == want and want["devices"][0]["id"] == "gpu:77" and want["fetched_ranks"] == 128
    # the CLI: --scheduler gives the in-process report
    outs = []
    for extra in ([], ["--scheduler", client.scheduler.address]):
        assert cli(["localize", str(slow_job), "--analysis", "persistent", "--format", "json", "-q", *extra]) == 0
        d = json.loads(capsys.readouterr().out)
        d.pop("bytes_read"), d.pop("timing", None)
        outs.append(d)
    assert outs[0] == outs[1] and outs[0]["devices"][0]["id"] == "gpu:77"
