"""Alembic environment for the ledger's schema.

Everything is created in the ledger's own schema (`alembic_config` puts its name in the
config's attributes): the connection's `search_path` is that schema alone, and Alembic's
version table lives there too. The schema itself is created here when it is missing.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, MetaData, pool, text

from opledger.ledger.connector import ledger_engine
from opledger.ledger.migrate import VERSION_TABLE
from opledger.ledger.pgschema import schema_from_environment

config = context.config
#: no tables: each migration is written by hand (`schema.sql` is the schema to read, and
#: tests/integration/test_schema_sql.py holds it to what the migrations build), but the
#: names the migrations' keys, indexes and checks are given by this convention (a
#: migration's `ck_operations_x` is created as `ck_operations_ck_operations_x`), as every
#: database already migrated has them
target_metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)
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
