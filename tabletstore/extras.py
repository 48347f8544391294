"""The optional extras of the package, and the error that names the one to install.

``pip install tabletstore`` brings the engine, the embedded database, the cluster processes
and the command line. Three parts need more, declared as extras in ``pyproject.toml``:

=================  ==========================================  ============================
extra              brings                                      needed by
=================  ==========================================  ============================
``batch``          dask[distributed,dataframe], pyspark, pandas  ``tabletstore.batch``'s Dask
                                                               and Spark engines,
                                                               ``bench.batch``
``bigtable-api``   google-cloud-bigtable, grpcio               ``tabletstore bigtable-api``,
                                                               ``tabletstore.bigtable_api``
``bench``          slatedb, matplotlib                         ``bench.paper``'s comparison
                                                               and chart
=================  ==========================================  ============================

Code that imports one of those modules does it under :func:`needs_extra`, so a missing one
ends in :class:`MissingExtra` naming the extra (``pip install 'tabletstore[batch]'``) rather
than in a bare ``ModuleNotFoundError: distributed``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

from tabletstore.errors import TabletStoreError

__all__ = ["EXTRA_MODULES", "MissingExtra", "check_extra", "needs_extra"]

#: The modules each extra installs (what an ``import`` names, not the distributions); a failed
#: import of anything under their top-level packages is blamed on the extra.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "batch": ("dask.dataframe", "distributed", "pandas", "pyspark"),
    "bigtable-api": ("google.cloud.bigtable", "grpc"),
    "bench": ("slatedb", "matplotlib"),
    "docs": ("mkdocs", "material", "mkdocstrings"),
}


class MissingExtra(TabletStoreError, ModuleNotFoundError):
    """A module of an optional extra is not installed; the message says what to install.
    Also a ModuleNotFoundError, so code that tolerates a missing module still does."""


@contextmanager
def needs_extra(extra: str, *, what: str | None = None) -> Iterator[None]:
    """Imports in the block that fail for a module of ``extra`` raise :class:`MissingExtra`
    (``what``, e.g. "the Cloud Bigtable API", says who needs it); any other failed import
    propagates unchanged."""
    packages = {m.split(".")[0] for m in EXTRA_MODULES[extra]}
    try:
        yield
    except ModuleNotFoundError as exc:
        if isinstance(exc, MissingExtra) or (exc.name or "").split(".")[0] not in packages:
            raise
        who = what or "this"
        raise MissingExtra(
            f"{who} needs the {extra} extra: pip install 'tabletstore[{extra}]' "
            f"(no module named {exc.name!r})",
            name=exc.name,
        ) from exc


def check_extra(extra: str, *modules: str, what: str | None = None) -> None:
    """Import ``modules`` of ``extra`` (default: all of them) now, so that a program that
    needs them fails at its start rather than after minutes of work."""
    with needs_extra(extra, what=what):
        for module in modules or EXTRA_MODULES[extra]:
            importlib.import_module(module)
