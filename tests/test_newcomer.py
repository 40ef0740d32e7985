"""What a newcomer tried (issue #19, item 6): a model from ``holmes train`` used by ``holmes
localize --detector``, a ``topology.json`` for their own cluster, the formats documented in the
project's own ``docs/`` (the worked example runs), the torch example without torch, refusals
that say what is wrong."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import holmes
from holmes.cli.main import main

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "fixtures"


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def labelled_job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("newcomer") / "job"
    assert main(["simulate", "--out", str(out), "--tp", "2", "--pp", "2", "--dp", "4", "--iterations", "24",
                 "--seed", "3", "--fault", "gpu:5@spike*3", "--quiet"]) == 0
    return out


def test_train_then_localize_with_the_model_by_bare_name(labelled_job, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", str(labelled_job), "--out", "mymodel", "--n-estimators", "8", "--max-ranks", "16",
                 "--quiet"]) == 0
    assert (tmp_path / "mymodel.json").is_file() and (tmp_path / "mymodel.npz").is_file()
    capsys.readouterr()
    assert main(["localize", str(labelled_job), "--detector", "mymodel", "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["params"]["detector"] == "mymodel"
    # a job this small is read whole and compared cell by cell (no operator label used, so no
    # detector assumption); searched from the pivot, the trained model (not the shipped one) flags
    searched = holmes.localize(labelled_job, detector="mymodel", full_read=0)
    assert any("OperatorDetector" in a for a in searched.assumptions), searched.assumptions
    named = [d["id"] for d in rep["devices"] + rep["candidates"]]
    assert named and named[0] == "gpu:5", named


def test_train_refuses_jobs_without_an_abnormal_op(tmp_path, capsys):
    job = tmp_path / "clean"
    assert main(["simulate", "--out", str(job), "--tp", "2", "--pp", "1", "--dp", "2", "--iterations", "6",
                 "--quiet"]) == 0
    assert main(["train", str(job), "--out", str(tmp_path / "m"), "--n-estimators", "2", "--quiet"]) == 2
    assert "abnormal" in _one_line_error(capsys)
    assert not (tmp_path / "m.json").exists()


def test_train_out_into_a_missing_directory_is_refused_not_created(labelled_job, tmp_path, capsys):
    out = tmp_path / "no-such-dir" / "model"
    assert main(["train", str(labelled_job), "--out", str(out), "--n-estimators", "2", "--quiet"]) == 2
    err = _one_line_error(capsys)
    assert "does not exist" in err and "no-such-dir" in err
    assert not out.parent.exists()


def _doc_blocks(lang: str) -> list[str]:
    text = (REPO / "docs" / "formats.md").read_text(encoding="utf-8")
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_formats_doc_is_the_projects_own_and_linked():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/formats.md" in readme and "docs/install.md" in readme
    text = (REPO / "docs" / "formats.md").read_text(encoding="utf-8")
    assert "../shared" not in text
    for col in ("rank", "iteration", "op_index", "comm_id", "seq", "op", "peer", "nbytes", "start_ns", "end_ns",
                "state"):
        assert f"| `{col}` |" in text, col
    assert "part-000000.parquet" in text and "topology.json" in text and "job.json" in text


def test_formats_worked_example_runs_and_names_the_slow_gpu(tmp_path, monkeypatch, capsys):
    (script,) = [b for b in _doc_blocks("python") if "make_job" in b or "my-job" in b]
    topo = next(b for b in _doc_blocks("json") if "holmes.topology/1" in b)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "topology.json").write_text(topo)
    exec(compile(script, "docs/formats.md", "exec"), {"__name__": "__doc_example__"})
    job = holmes.read_job(tmp_path / "my-job")
    assert job.world_size == 8 and set(job.communicators) >= {"tp-2", "dp-1"}
    assert main(["localize", "my-job", "--topology", "topology.json", "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    named = [d["id"] for d in rep["devices"] + rep["candidates"]]
    assert named and named[0] == "gpu:5", rep["verdict"]
    assert not any("no topology.json" in a for a in rep["assumptions"])    # the user's cluster, not the default
    assert main(["localize", "my-job", "--format", "json"]) == 0
    assert any("no topology.json" in a for a in json.loads(capsys.readouterr().out)["assumptions"])


def test_topology_file_describes_the_hosts(tmp_path):
    topo = next(b for b in _doc_blocks("json") if "holmes.topology/1" in b)
    (tmp_path / "topology.json").write_text(topo)
    t = holmes.topology.load_topology(tmp_path / "topology.json")
    assert t.gpus_per_host == 4 and t.host_of(5) == 1 and t.num_gpus == 8


def test_torch_example_without_torch_says_so_in_one_line():
    code = ("import sys, runpy; sys.modules['torch'] = None; sys.argv = ['x', '--no-localize']; "
            "runpy.run_path(%r, run_name='__main__')"
            % str(REPO / "examples" / "torch_capture_and_localize.py"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1
    assert "needs PyTorch" in p.stderr and p.stdout == ""
