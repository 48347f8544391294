"""``python -m bench.chaos`` refuses what it cannot run, naming the problem, before it starts
any server (a reused ``--dir`` held the last run's etcd data, so its setup failed with
``AlreadyExists`` for the chaos table after the servers had started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import chaos


def _error_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        chaos.main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_a_directory_of_an_earlier_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "etcd").mkdir()
    err = _error_of(["--minutes", "1", "--dir", str(tmp_path)], capsys)
    assert f"--dir {tmp_path} is not empty" in err


def test_a_file_as_the_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "history.json"
    target.write_text("{}")
    err = _error_of(["--minutes", "1", "--dir", str(target)], capsys)
    assert "is not a directory" in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--faults", "kill_everything"], "unknown faults ['kill_everything']"),
        (["--minutes", "0"], "--minutes must be positive"),
        (["--gap", "5"], "--gap takes LO,HI"),
        (["--gap", "9,3"], "--gap needs 0 < LO <= HI"),
    ],
)
def test_bad_arguments_are_named(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert named in _error_of(argv, capsys)
