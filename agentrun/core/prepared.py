"""The decision cycle's statements as SQL written once, instead of a queryset compiled on every call.

Django compiles a query anew each time it runs it, and builds model instances through the generic
path; on the decision cycle (suspend → decide → continue) that was half of the engine's CPU
(docs/performance.md, "Decision cycle and topology (third pass)" and its fourth pass). The hot
statements use this module instead: their SQL text is built once per model and database, the
parameters are adapted by the model's own fields (``get_db_prep_save``: the same JSON and datetime
encoding as the ORM's), and rows come back through the fields' own converters into instances made
with ``Model.from_db``, as the ORM makes them. The models written here have no ``save()`` of their own
and no model signals, so the ORM and this module write the same rows.

Only ``default`` is used (the engine has one database). SQL here is plain, portable SQL: PostgreSQL
and SQLite (≥ 3.35 for ``RETURNING``) read the same text. On PostgreSQL its parameters are bound by the
server, not quoted into the text by psycopg as the ORM's are (``cursor()``): the text stays the same
from one call to the next, so the server prepares it on the connection once it has run
``prepare_threshold`` times (settings: ``AGENTRUN_DB_PREPARE_THRESHOLD``) and plans it no more. A
parameter must therefore have a type the server can infer from where it stands (a column's value, a
comparison with a column); one that stands alone takes a cast.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import AutoField, BooleanField, CharField, Field, IntegerField, Model, TextField


def connection() -> Any:
    return connections[DEFAULT_DB_ALIAS]


def cursor() -> Any:
    """A cursor of ``default`` for this module's statements, wrapped as Django wraps every cursor
    (execute wrappers, query logging, error translation). On PostgreSQL it binds parameters on the
    server (Django's own class for ``server_side_binding``); on SQLite it turns a statement's ``%s``
    into ``?`` once per text, not on every run as Django's cursor does (a regular expression over the
    whole statement, 4% of a SQLite cycle's CPU)."""
    conn = connection()
    conn.ensure_connection()
    with conn.wrap_database_errors:
        if conn.vendor == "postgresql":
            return conn._prepare_cursor(_server_binding_cursor()(conn.connection))
        if conn.vendor == "sqlite":
            return conn._prepare_cursor(conn.connection.cursor(factory=_sqlite_cursor()))
    return conn.cursor()


@functools.cache
def _server_binding_cursor() -> type:
    from django.db.backends.postgresql.base import ServerBindingCursor  # psycopg is needed only here

    return ServerBindingCursor


@functools.cache
def _sqlite_cursor() -> type:
    import sqlite3

    from django.db.backends.sqlite3.base import FORMAT_QMARK_REGEX, SQLiteCursorWrapper

    @functools.lru_cache(maxsize=1024)  # this module's texts: a few dozen shapes
    def qmark(sql: str) -> str:
        return FORMAT_QMARK_REGEX.sub("?", sql).replace("%%", "%")

    class QmarkCursor(SQLiteCursorWrapper):
        def execute(self, query: str, params: Any = None) -> Any:
            if params is None:
                return sqlite3.Cursor.execute(self, query)
            return sqlite3.Cursor.execute(self, qmark(query), params)

    return QmarkCursor


def execute(sql: str, params: Sequence[Any] = ()) -> int:
    """Run one statement; the number of rows it changed."""
    with cursor() as c:
        c.execute(sql, params)
        return c.rowcount


def execute_all(statements: Sequence[Statement]) -> None:
    """Run the statements in their order, in the caller's transaction. On PostgreSQL they are sent
    together and their results read once (psycopg's pipeline mode): one round trip for all of them,
    each still a statement of its own (its triggers fire at its end, in this order). An error of any
    is raised once all were sent; the ones after it did not run."""
    conn = connection()
    if conn.vendor != "postgresql" or len(statements) < 2:
        for statement in statements:
            execute(statement.sql, statement.params)
        return
    with cursor() as c, conn.wrap_database_errors, conn.connection.pipeline():
        for statement in statements:
            c.execute(statement.sql, statement.params)


def fetch(sql: str, params: Sequence[Any] = ()) -> list[tuple]:
    """Run one statement and read every row it returns (all of them: an ``UPDATE … RETURNING`` ends
    only once its rows are read)."""
    with cursor() as c:
        c.execute(sql, params)
        return c.fetchall()


# --- one statement per write ---------------------------------------------------------------------
# On PostgreSQL a write of several statements is sent as one: a data-modifying WITH whose first part
# (an UPDATE … RETURNING, ``fenced``) decides whether the others happen — each of them runs only if
# the first returned a row (``WHERE EXISTS (SELECT 1 FROM first)``). One statement is atomic on its
# own: no BEGIN and COMMIT around it, one round trip instead of N + 2. SQLite has no data-modifying
# WITH: there the caller runs the statements one after the other in its transaction.
#
# PostgreSQL runs the parts of a WITH, and fires their statement triggers, in an order of its own:
# a write whose triggers lock rows that other writers also lock (the counters of the waiting calls,
# of the listing, of the decisions) must not share a statement with another such write, or the two
# counters could be locked in the other order than everyone else's, and writers deadlock.
GATE = "first"
ONE_STATEMENT_VENDORS = {"postgresql"}


def one_statement() -> bool:
    """Whether a write of several statements is sent as one (``run_gated``) on this database."""
    return connection().vendor in ONE_STATEMENT_VENDORS


@dataclass(frozen=True)
class Statement:
    """One statement of a write: ``sql``, and ``gated``, the same run only if the write's first part
    returned a row (PostgreSQL, inside ``run_gated``'s WITH)."""

    sql: str
    params: Sequence[Any]
    gated: str = ""


def run_gated(first: Statement, rest: Sequence[Statement]) -> list[tuple]:
    """Run ``first`` (which returns rows), then ``rest`` if it returned any; the rows of ``first``.
    One statement where ``one_statement()``; else in order (the caller holds a transaction)."""
    if not rest:
        return fetch(first.sql, first.params)
    if not one_statement():
        rows = fetch(first.sql, first.params)
        if rows:
            for statement in rest:
                execute(statement.sql, statement.params)
        return rows
    parts = [f"{GATE} AS ({first.sql})", *(f"w{i} AS ({s.gated})" for i, s in enumerate(rest))]
    params = [*first.params]
    for statement in rest:
        params += statement.params
    return fetch(f"WITH {', '.join(parts)} SELECT * FROM {GATE}", params)


_GATED = f" EXISTS (SELECT 1 FROM {GATE})"


def _plain_type(field: Field) -> type | None:
    """The Python type whose values (and None) a field sends to the database unchanged: a value of
    exactly that type skips ``get_db_prep_save`` (which returns it as it is)."""
    target: Any = getattr(field, "target_field", field) if field.is_relation else field
    if isinstance(target, CharField | TextField):
        return str
    if isinstance(target, BooleanField):
        return bool
    if isinstance(target, IntegerField):
        return int
    return None


def quote(name: str | None) -> str:
    """A table's or a column's name, quoted (a concrete field always has a column)."""
    assert name is not None
    return connection().ops.quote_name(name)


class Table:
    """One model's rows: inserted from instances, read into instances, by SQL built once per database.

    ``columns`` / ``select``: the model's concrete fields in declaration order (``from_db``'s order);
    ``prep(field, value)`` adapts a value for a column the way the ORM's save does.
    """

    _cache: dict[tuple[type[Model], str], Table] = {}

    def __init__(self, model: type[Model], vendor: str) -> None:
        self.model = model
        self.vendor = vendor
        meta = model._meta
        self.name = quote(meta.db_table)
        self.fields: list[Field] = list(meta.concrete_fields)
        self.by_name: dict[str, Field] = {}
        for f in self.fields:
            self.by_name[f.name] = f
            self.by_name[f.attname] = f
        self.attnames = [f.attname for f in self.fields]
        # Written: every concrete field but an auto-incremented key (the database numbers it).
        self.written = [f for f in self.fields if not isinstance(f, AutoField)]
        self.insert_head = f"INSERT INTO {self.name} ({', '.join(quote(f.column) for f in self.written)}) VALUES "
        self.row_placeholder = "(" + ", ".join(["%s"] * len(self.written)) + ")"
        self.plain = {f.name: _plain_type(f) for f in self.fields}
        self.write_plan = [(f, f.attname, self.plain[f.name]) for f in self.written]
        self.insert_head_select = f"INSERT INTO {self.name} ({', '.join(quote(f.column) for f in self.written)}) "
        self._sql: dict[tuple, str] = {}  # statements of this table, by shape
        self._statements: dict[tuple, tuple[str, str]] = {}  # (plain, gated), by shape
        self.select = ", ".join(f"{self.name}.{quote(f.column)}" for f in self.fields)
        db = connection()
        self.converters: list[tuple[int, list, Any]] = []
        for index, f in enumerate(self.fields):
            col = f.get_col(meta.db_table)
            found = db.ops.get_db_converters(col) + f.get_db_converters(db)
            if found:
                self.converters.append((index, found, col))

    @classmethod
    def of(cls, model: type[Model]) -> Table:
        vendor = connection().vendor
        key = (model, vendor)
        table = cls._cache.get(key)
        if table is None:
            table = cls._cache[key] = cls(model, vendor)
        return table

    # --- values ---------------------------------------------------------------------------------
    def prep(self, name: str, value: Any) -> Any:
        """``value`` adapted for the column, as the ORM's save adapts it."""
        field = self.by_name[name]
        plain = self.plain[field.name]
        if plain is not None and (value is None or type(value) is plain):
            return value
        return field.get_db_prep_save(value, connection())

    def column(self, name: str) -> str:
        return quote(self.by_name[name].column)

    def set_clause(self, names: Iterable[str]) -> str:
        return ", ".join(f"{self.column(n)} = %s" for n in names)

    # --- writing --------------------------------------------------------------------------------
    def insert_statement(self, objs: Sequence[Model], *, suffix: str = "") -> Statement:
        """The INSERT of the instances, in one statement (their defaults were set when they were made);
        ``suffix``: ``ON CONFLICT …``."""
        db = connection()
        params: list[Any] = []
        for obj in objs:
            for field, attname, plain in self.write_plan:
                value = getattr(obj, attname)
                if plain is None or (value is not None and type(value) is not plain):
                    value = field.get_db_prep_save(value, db)
                params.append(value)
            obj._state.adding = False
            obj._state.db = DEFAULT_DB_ALIAS
        key = ("insert", len(objs), suffix)
        sqls = self._statements.get(key)
        if sqls is None:
            rows = ", ".join([self.row_placeholder] * len(objs))
            # Gated, the values are a SELECT: typed placeholders (as the columns' types without a length,
            # so that a value too long still fails as it would in VALUES).
            typed = "(" + ", ".join(f"%s::{f.cast_db_type(db)}" for f in self.written) + ")"
            select = f"SELECT v.* FROM (VALUES {', '.join([typed] * len(objs))}) AS v WHERE{_GATED}"
            sqls = self._statements[key] = (self.insert_head + rows + suffix, self.insert_head_select + select + suffix)
        return Statement(sqls[0], params, sqls[1])

    def insert(self, objs: Sequence[Model], *, suffix: str = "") -> int:
        """INSERT the instances in one statement; the number of rows inserted."""
        if not objs:
            return 0
        statement = self.insert_statement(objs, suffix=suffix)
        return execute(statement.sql, statement.params)

    def update_statement(self, obj: Model, names: Sequence[str]) -> Statement:
        """The UPDATE of these fields of ``obj``'s row (``save(update_fields=…)`` without the signals,
        which none of these models has)."""
        key = ("update", tuple(names))
        sqls = self._statements.get(key)
        if sqls is None:
            sql = f"UPDATE {self.name} SET {self.set_clause(names)} WHERE {quote(self.model._meta.pk.column)} = %s"
            sqls = self._statements[key] = (sql, f"{sql} AND{_GATED}")
        params = [self.prep(n, getattr(obj, self.by_name[n].attname)) for n in names]
        return Statement(sqls[0], [*params, obj.pk], sqls[1])

    def delete_statement(self, where: str, params: Sequence[Any]) -> Statement:
        """The DELETE of the rows ``where`` says (SQL on this table's columns, unqualified)."""
        key = ("delete", where)
        sqls = self._statements.get(key)
        if sqls is None:
            sql = f"DELETE FROM {self.name} WHERE {where}"
            sqls = self._statements[key] = (sql, f"{sql} AND{_GATED}")
        return Statement(sqls[0], params, sqls[1])

    def update(self, obj: Model, names: Sequence[str]) -> int:
        """UPDATE these fields of ``obj``'s row; the number of rows changed."""
        statement = self.update_statement(obj, names)
        return execute(statement.sql, statement.params)

    def delete(self, where: str, params: Sequence[Any]) -> int:
        """DELETE the rows ``where`` says; the number of rows deleted."""
        statement = self.delete_statement(where, params)
        return execute(statement.sql, statement.params)

    # --- reading --------------------------------------------------------------------------------
    def rows(self, where: str, params: Sequence[Any], *, order: str = "", lock: bool = False) -> list[Any]:
        """Instances of the rows ``where`` says (SQL on this table's columns, unqualified), in ``order``;
        ``lock``: ``FOR UPDATE`` where the database has it (SQLite's writers serialise anyway)."""
        key = ("rows", where, order, lock)
        sql = self._sql.get(key)
        if sql is None:
            sql = f"SELECT {self.select} FROM {self.name} WHERE {where}"
            if order:
                sql += f" ORDER BY {order}"
            if lock and connection().features.has_select_for_update:
                sql += " FOR UPDATE"
            self._sql[key] = sql
        return [self.instance(row) for row in fetch(sql, params)]

    def values(self, names: Sequence[str], where: str, params: Sequence[Any], *, order: str = "") -> list[tuple]:
        """The columns ``names`` of the rows ``where`` says, as the driver reads them (no converters, no
        instances: for a reader that handles a few columns itself), in ``order``."""
        key = ("values", tuple(names), where, order)
        sql = self._sql.get(key)
        if sql is None:
            sql = f"SELECT {', '.join(self.column(n) for n in names)} FROM {self.name} WHERE {where}"
            if order:
                sql += f" ORDER BY {order}"
            self._sql[key] = sql
        return fetch(sql, params)

    def convert(self, row: Sequence[Any], offset: int = 0) -> list[Any]:
        """The model's values from ``row[offset:offset + len(fields)]``, converted as the ORM does."""
        values = list(row[offset : offset + len(self.fields)])
        if self.converters:
            db = connection()
            for index, converters, col in self.converters:
                value = values[index]
                for converter in converters:
                    value = converter(value, col, db)
                values[index] = value
        return values

    def reader(self, name: str) -> Any:
        """A function converting one column's value as read (``name``'s converters), for rows that are
        not instances."""
        f = self.by_name[name]
        db = connection()
        col = f.get_col(self.model._meta.db_table)
        converters = db.ops.get_db_converters(col) + f.get_db_converters(db)

        def read(value: Any) -> Any:
            for converter in converters:
                value = converter(value, col, db)
            return value

        return read

    def instance(self, row: Sequence[Any], offset: int = 0) -> Any:
        """A model instance from a row selected with ``select`` (at ``offset``)."""
        return self.model.from_db(DEFAULT_DB_ALIAS, self.attnames, self.convert(row, offset))


def table(model: type[Model]) -> Table:
    return Table.of(model)
