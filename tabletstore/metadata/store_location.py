"""Where a database keeps its objects: the object store behind a database URL.

A batch job reads a snapshot from the bucket alone (§8), so what it opens is an object store;
what a user knows is the database's URL. :func:`locate_store` takes either:

* an embedded database's directory, ``file:///dir`` or a bare path (the directory holds the
  in-process coordinator's journal and ``objects/``, the store): ``file:///dir/objects``;
* a cluster's ``etcd://host:port/namespace``: the store its master recorded
  (:class:`~tabletstore.metadata.catalog.ClusterSettings`);
* a store URL (``s3://bucket/prefix?...``, ``file:///dir/objects``, ``memory://name``, which
  is also the in-memory database of that name): itself.

The answer names both what was given and the store it resolved to, so an error can say which
store it searched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from tabletstore.coordination import open_coordinator
from tabletstore.coordination.local import JOURNAL
from tabletstore.metadata.catalog import ClusterSettings

__all__ = ["OBJECTS_DIR", "StoreLocation", "embedded_store_url", "locate_store"]

#: The embedded database directory's object store, a subdirectory of it.
OBJECTS_DIR = "objects"


def embedded_store_url(directory: str) -> str:
    """The store URL of the embedded database in ``directory`` (an absolute path)."""
    return f"file://{directory}/{OBJECTS_DIR}"


@dataclass(frozen=True)
class StoreLocation:
    """The store to open (``url``) for what the caller gave (``given``)."""

    url: str
    given: str

    def __str__(self) -> str:
        if self.url == self.given:
            return f"the store {self.url}"
        return f"the store {self.url} (the objects of database {self.given})"


def _embedded_directory(url: str) -> Path | None:
    """The directory of the embedded database ``url`` names, None if it names none."""
    if url.startswith("file://"):
        path = unquote(url[len("file://") :])
    elif "://" not in url:
        path = url
    else:
        return None
    if not path:
        return None
    directory = Path(path).resolve()
    if (directory / JOURNAL).is_file() and (directory / OBJECTS_DIR).is_dir():
        return directory
    return None


async def locate_store(url: str) -> StoreLocation:
    """The store holding the objects of ``url``, a database URL or a store URL (module
    docstring). NotFound when a cluster has recorded no store; a cluster's coordinator is
    reached once, and closed."""
    if url.startswith("etcd://"):
        coordinator = open_coordinator(url)
        try:
            settings = await ClusterSettings.load(coordinator)
        finally:
            await coordinator.close()
        return StoreLocation(settings.store_url, given=url)
    directory = _embedded_directory(url)
    if directory is not None:
        return StoreLocation(embedded_store_url(str(directory)), given=url)
    return StoreLocation(url, given=url)
