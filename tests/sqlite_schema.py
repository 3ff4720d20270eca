"""A migrated SQLite database for test coordinators, made once per test session and copied.

Contract: :func:`migrated` puts a copy of a database on which every default migration of the
coordinator (its core and its route modules') has run at the file a ``sqlite:///`` URL names,
when that file does not exist yet and its folder does; any other URL (PostgreSQL), an existing
file and a missing folder are left alone. :meth:`Coordinator.open
<anex_agent.coordinator.context.Coordinator.open>` then finds the schema in place and applies
nothing, as on a restart.

Why: applying the migrations took about half of a test coordinator's start (tens of statements,
each a trip to the database thread), and a few hundred tests start one. The copy holds the
schema and the migrations' fixed rows only: a cluster id, keys and tokens are still made by each
coordinator on first use. The migrations themselves run on fresh databases in
``tests/coordinator/test_db.py`` and in every coordinator process the tests start.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from anex_agent.coordinator import migrations
from anex_agent.coordinator.db import open_database
from anex_agent.coordinator.routes import modules

_template: Path | None = None


async def _make() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="anex-test-schema-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "coordinator.db"
    db = await open_database(f"sqlite:///{path}")
    try:
        await migrations.apply(db, [*migrations.CORE, *modules.module_migrations(modules.load_modules())])
    finally:
        await db.close()
    return path


async def migrated(database_url: str) -> None:
    """Copy the migrated database to ``database_url``'s file (SQLite, not there yet); see the module."""
    global _template
    if not database_url.startswith("sqlite:///"):
        return
    target = Path(database_url.removeprefix("sqlite:///"))
    if target.exists() or not target.parent.is_dir():
        return
    if _template is None:
        _template = await _make()
    for suffix in ("", "-wal"):
        source = _template.with_name(_template.name + suffix)
        if source.exists():
            shutil.copyfile(source, target.with_name(target.name + suffix))
