"""Apply the ledger's Alembic migrations from code (no alembic.ini needed)."""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

if TYPE_CHECKING:  # Alembic is imported when migrating, not by every user of the ledger
    from alembic.config import Config


def sqlalchemy_url(url: str) -> str:
    """Normalize a Postgres URL to the psycopg 3 driver SQLAlchemy should use."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at the packaged migrations and at `url`."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("opledger.ledger") / "migrations"))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision` (default: the newest schema)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Step the database at `url` back to `revision` ('base' drops everything)."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)
