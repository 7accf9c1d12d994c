"""Alembic environment for the ledger's schema.

Everything is created in the ledger's own schema (`alembic_config` puts its name in the
config's attributes): the connection's `search_path` is that schema alone, and Alembic's
version table lives there too. The schema itself is created here when it is missing.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, pool, text

from opledger.ledger.migrate import VERSION_TABLE
from opledger.ledger.pgschema import ledger_engine, schema_from_environment
from opledger.ledger.schema import metadata

config = context.config
target_metadata = metadata
schema: str = config.attributes.get("schema") or schema_from_environment()


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        version_table_schema=schema,
    )


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _configure(connectable)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url")
    assert url
    engine = ledger_engine(url, schema=schema, poolclass=pool.NullPool)
    with engine.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        connection.commit()
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        version_table_schema=schema,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
