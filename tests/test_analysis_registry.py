"""The analysis registry (``pipeline.ANALYSIS_CLASSES``) is the one list of analyses the pipeline,
the parameters, the CLI and the report go by."""

from __future__ import annotations

from holmes.cli.localize_cmd import add_parser
from holmes.localize import ANALYSES, ANALYSIS_CLASSES, Localizer
from holmes.localize.pipeline import Finding, decide_verdict


def test_names_follow_the_registry():
    assert ANALYSES == (*ANALYSIS_CLASSES, "all")
    for name, cls in ANALYSIS_CLASSES.items():
        assert cls.name == name
        assert all(callable(getattr(cls, m)) for m in ("select", "gather", "rank", "ends_run", "report_fields"))
        assert isinstance(cls.reads_every_rank, bool)
    assert [n for n, c in ANALYSIS_CLASSES.items() if c.reads_every_rank] == ["persistent"]


def test_all_runs_every_registered_analysis_in_order():
    assert [a.name for a in Localizer().analyses()] == list(ANALYSIS_CLASSES)
    assert [a.name for a in Localizer(analysis="persistent").analyses()] == ["persistent"]


def test_cli_choices_are_the_registry():
    import argparse

    p = argparse.ArgumentParser()
    add_parser(p)
    action = next(a for a in p._actions if a.dest == "analysis")
    assert tuple(action.choices) == ANALYSES


class _Ev:
    found = True

    @staticmethod
    def to_json():
        return {"communicators": []}


def test_a_finding_that_ends_the_run_decides_the_verdict_and_fills_its_field():
    hang = Finding("hang", None, _Ev(), [])
    other = Finding("custom", None, _Ev(), [])  # an unregistered analysis ends nothing
    assert decide_verdict([hang], []) == "hang"
    assert decide_verdict([other], []) == "healthy"
    assert ANALYSIS_CLASSES["hang"].report_fields(None, hang) == {"hang": {"communicators": []}}


def test_the_irregular_analysis_has_two_strategies_chosen_by_job_size():
    from pathlib import Path

    from holmes.localize.irregular.analysis import IrregularAnalysis, PivotSearch, WholeJobComparison

    job = Path(__file__).resolve().parents[1] / "fixtures" / "gpu16-clean"
    small = Localizer().prepare(job)                 # 16 ranks <= full_read: read whole
    forced = Localizer(full_read=0).prepare(job)     # Algorithm 1 on the detector's labels
    assert type(IrregularAnalysis().for_run(small)) is WholeJobComparison
    assert type(IrregularAnalysis().for_run(forced)) is PivotSearch
    assert PivotSearch().for_run(small).whole_job is False      # a chosen strategy stays chosen
    # the strategy is what the pipeline runs: the search path reads only what it visits
    whole = Localizer(analysis="irregular").localize(job)
    search = Localizer(analysis="irregular", full_read=0).localize(job)
    assert len(whole.fetched) == 16 and len(search.fetched) < 16
