"""SQLite metadata store (``sqlite:///abs/path.db``): the embedded default.

:mod:`.store` holds the API, :mod:`.schema` the file's tables and the SQL operations share,
:mod:`.locks` the leased locks, :mod:`.watches` the polling watches and their baselines.
"""

from pybk.metadata.sqlite.schema import SCHEMA_VERSION
from pybk.metadata.sqlite.store import SqliteMetadataStore

__all__ = ["SCHEMA_VERSION", "SqliteMetadataStore"]
