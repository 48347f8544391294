"""A missing optional extra names the extra to install (tabletstore/extras.py), wherever an
extra's module is imported: the batch engines, the Spark data source, the Bigtable API package
and the benchmarks that need them."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tabletstore.errors import TabletStoreError
from tabletstore.extras import EXTRA_MODULES, MissingExtra, check_extra, needs_extra

ROOT = Path(__file__).resolve().parents[2]


def test_every_extra_of_the_package_is_known() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(config["project"]["optional-dependencies"]) - {"test"}
    assert set(EXTRA_MODULES) == extras


def test_a_missing_module_of_an_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # importing it now fails as if absent
    with pytest.raises(MissingExtra) as missing:
        with needs_extra("batch", what="this job"):
            import distributed  # noqa: F401
    message = str(missing.value)
    assert message.startswith("this job needs the batch extra: pip install 'tabletstore[batch]'")
    assert "'distributed'" in message
    # Code that tolerates a missing module still does; the CLI prints it as one line.
    assert isinstance(missing.value, ModuleNotFoundError)
    assert isinstance(missing.value, TabletStoreError)
    with pytest.raises(MissingExtra, match=r"tabletstore\[batch\]"):
        check_extra("batch")


def test_a_missing_module_of_no_extra_is_not_blamed_on_one() -> None:
    with pytest.raises(ModuleNotFoundError) as missing:
        with needs_extra("batch"):
            import no_such_module_anywhere  # type: ignore[import-not-found]  # noqa: F401
    assert not isinstance(missing.value, MissingExtra)


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment whose Python cannot import ``modules`` (stand-ins that fail as a
    missing module does), with this checkout first on the path."""
    fake = tmp_path / "missing"
    fake.mkdir(exist_ok=True)
    for name in modules:
        (fake / f"{name}.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name='{name}')\n"
        )
    path = os.pathsep.join([str(fake), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def test_bench_batch_without_the_batch_extra_says_which_to_install(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.batch", "--rows", "100", "--repeats", "1",
         "--load-repeats", "1"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
        env=_without(tmp_path, "distributed"),
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert "pip install 'tabletstore[batch]'" in done.stderr, done.stderr
    assert "python -m bench.batch needs the batch extra" in done.stderr


def test_the_library_modules_of_an_extra_name_it(tmp_path: Path) -> None:
    script = """
import sys
from tabletstore.extras import MissingExtra
for module in ("tabletstore.batch.spark", "tabletstore.bigtable_api.front_door"):
    try:
        __import__(module)
    except MissingExtra as exc:
        print(module, "->", exc)
from tabletstore.batch.engines import dask_dataframe
try:
    dask_dataframe("memory://nowhere", "s-none")
except MissingExtra as exc:
    print("dask_dataframe ->", exc)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env=_without(tmp_path, "pyspark", "dask", "grpc"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(" ->")[0] for line in lines] == [
        "tabletstore.batch.spark",
        "tabletstore.bigtable_api.front_door",
        "dask_dataframe",
    ], done.stdout
    assert "pip install 'tabletstore[batch]'" in lines[0]
    assert "pip install 'tabletstore[bigtable-api]'" in lines[1]
    assert "pip install 'tabletstore[batch]'" in lines[2]
