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
        (["--faults", "etcd_quorum_loss"], "need --etcd-members 3"),
        (["--etcd-members", "3", "--tls"], "--tls runs etcd as one member"),
        (["--faults", "replace_etcd_member"], "need --etcd-members 3"),
        (["--store", "minio"], "argument --store: invalid choice: 'minio'"),
    ],
)
def test_bad_arguments_are_named(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert named in _error_of(argv, capsys)


def test_recheck_checks_a_saved_history_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tabletstore.testing.chaos.history import History, Kind, Outcome

    history = History()
    for value, start in ((b"a", 0.0), (b"b", 2.0)):
        op = history.invoke("w", Kind.PUT, row=b"r", value=value)
        op.start, op.end, op.outcome = start, start + 1, Outcome.OK
    read = history.invoke("r", Kind.READ, row=b"r")
    read.start, read.end, read.outcome, read.seen = 4.0, 5.0, Outcome.OK, b"a"  # stale
    history.save(tmp_path / "history.json")
    assert chaos.main(["--recheck", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "linearizability violations: 1" in out and "NOT LINEARIZABLE r f:c" in out
    assert chaos.main(["--recheck", str(tmp_path / "nothing")]) == 2


def test_an_interrupted_run_exits_130_naming_its_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C: run_chaos stops its processes on the way out; main reports it in one line,
    not a traceback."""

    async def interrupted(config: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(chaos, "run_chaos", interrupted)
    assert chaos.main(["--minutes", "1", "--dir", str(tmp_path / "run")]) == 130
    out = capsys.readouterr().out
    assert f"interrupted; its processes are stopped, its files are in {tmp_path / 'run'}" in out
