"""``holmes convert`` on the command line."""

from __future__ import annotations

from pathlib import Path

from holmes.cli.main import main

DATA = Path(__file__).parent / "data" / "nccl_inspector"


def test_convert_cli_success_refusal_and_overwrite(tmp_path, capsys):
    out = tmp_path / "job"
    assert main(["convert", "--from", "nccl-inspector", str(DATA), str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert (out / "job.json").is_file() and len(list((out / "ranks").iterdir())) == 4
    assert main(["convert", "--from", "nccl-inspector", str(DATA), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err
    assert main(["convert", "--from", "nccl-inspector", str(DATA), str(out), "--overwrite", "-q"]) == 0


def test_convert_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "t.json"
    bad.write_text('{"traceEvents": [')
    assert main(["convert", "--from", "kineto", str(bad), str(tmp_path / "job")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("holmes convert: ") and "t.json" in err and err.count("\n") == 1
    try:
        main(["convert", "--from", "csv", str(bad), str(tmp_path / "job")])
    except SystemExit as exc:
        assert exc.code == 2
    else:  # pragma: no cover
        raise AssertionError("argparse accepted an unknown format")
