"""The single-key check: every statement of a ``replaysafe`` function touches one tenant's
rows, and of that tenant one key (docs/isolation.md, "Single-key functions").

Why: distributed with ``distribution_arg_name => 'p_tenant_id'`` (Citus), a function runs on
the worker that holds its tenant's shard, so every statement in it must stay inside that
tenant, and ideally inside one key (one action, one thread).

How: the whole schema (sql/, assembled) is parsed with Postgres' own parser (pglast, libpg_query);
PL/pgSQL bodies with its PL/pgSQL parser. Every SQL statement and every expression of every function is
walked, CTEs, subqueries, INSERT ... SELECT and ON CONFLICT included. A *tenant table* has a
``tenant_id`` column (the caller names the exceptions) and one key column (``action_key``,
``thread_id``). Each use of one must be pinned by equalities:

* SELECT / UPDATE / DELETE: top-level AND-conjuncts of WHERE (or of an inner JOIN's ON) equal
  its ``tenant_id`` to the tenant and its key column to the key. Equalities chain: a table
  joined ``t.tenant_id = x.tenant_id`` to a pinned ``x`` is pinned; a filter on a simple
  subquery's or view's column reaches the table behind it (Postgres pushes it down), not
  through LIMIT, OFFSET, window functions or UNION.
* INSERT: the value given to ``tenant_id`` (and to the key column) is the tenant (the key):
  in VALUES, or the SELECT's output column.
* The tenant is the parameter ``p_tenant_id``; the key of a table whose key column is ``c``
  is the parameter ``p_c`` (``p_action_key``, ``p_thread_id``). Also: a field of a parameter
  whose type is a tenant table's row (one row: one tenant, one key), and a PL/pgSQL variable
  every assignment of which is the tenant (the key), e.g. ``SELECT * INTO a`` from a pinned
  row. Nothing else: not a value read from a table, not ``= ANY (array)``, not an OR.
* A call of another replaysafe function that touches a tenant table (itself or through its
  calls) passes the tenant as its ``p_tenant_id`` and the key as its ``p_<key column>`` (or a
  pinned row as a row parameter), and the callee must pass the check itself: the rule
  follows the calls, each helper checked against its own parameters.
* Dynamic SQL (``EXECUTE`` of a computed string) cannot be checked: a finding. A constant
  string is parsed and checked like any statement.

A finding's ``rule`` is ``"tenant"`` (the statement may reach other tenants' rows) or
``"key"`` (one tenant, more than one key). A function with no finding is single-key; with
``"key"`` findings only, tenant-only.

Test code only: pglast is in the ``test`` extra, never a dependency of the package.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError, parse_plpgsql_json, scan
from pglast.stream import RawStream

SCHEMA = "replaysafe"
TENANT_COLUMN = "tenant_id"
TENANT = "tenant"

Tags = frozenset[str]
EMPTY: Tags = frozenset()
Rule = Literal["tenant", "key"]
Verdict = Literal["single-key", "tenant-only", "multi-tenant"]


def key_tag(column: str) -> str:
    return f"key:{column}"


@dataclass(frozen=True)
class Finding:
    function: str
    rule: Rule  # "tenant": may reach other tenants' rows; "key": one tenant, several keys
    line: int  # in the schema text
    statement: str
    problem: str

    def __str__(self) -> str:
        return (f"replaysafe.{self.function} (schema line {self.line}): {self.problem}\n"
                f"    statement: {self.statement}")


def verdict(findings: Sequence[Finding]) -> Verdict:
    if not findings:
        return "single-key"
    if all(f.rule == "key" for f in findings):
        return "tenant-only"
    return "multi-tenant"


# ---------------------------------------------------------------------------------------
# The schema, as parsed
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # lower case; "replaysafe.actions" for a row of that table


@dataclass
class Function:
    name: str
    language: str
    params: list[Param]  # the input parameters, in call order
    body: str
    body_line: int  # line of the schema text where the body starts
    node: ast.CreateFunctionStmt


@dataclass
class Schema:
    tables: dict[str, list[str]]  # replaysafe table -> its columns
    views: dict[str, ast.Node]  # replaysafe view -> its query
    functions: dict[str, Function]
    key_columns: dict[str, str]  # tenant table -> its key column
    composite_types: set[str]  # CREATE TYPE ... AS (...)


def _type_name(type_node: ast.TypeName) -> str:
    names = [n.sval for n in type_node.names if n.sval != "pg_catalog"]
    return ".".join(names).lower() + ("[]" if type_node.arrayBounds else "")


def load_schema(sql: str, *, key_columns: Mapping[str, str],
                not_tenant_tables: Collection[str]) -> Schema:
    """Tables, views and functions of schema ``replaysafe``; every table with a tenant_id
    column must be named in ``key_columns`` or in ``not_tenant_tables``."""
    tables: dict[str, list[str]] = {}
    views: dict[str, ast.Node] = {}
    functions: dict[str, Function] = {}
    composite_types: set[str] = set()
    search_from = 0
    for raw in parse_sql(sql):
        stmt = raw.stmt
        if isinstance(stmt, ast.CreateStmt) and stmt.relation.schemaname == SCHEMA:
            tables[stmt.relation.relname] = [
                e.colname for e in stmt.tableElts or () if isinstance(e, ast.ColumnDef)]
        elif isinstance(stmt, ast.CompositeTypeStmt) and stmt.typevar.schemaname == SCHEMA:
            composite_types.add(stmt.typevar.relname)
        elif isinstance(stmt, ast.ViewStmt) and stmt.view.schemaname == SCHEMA:
            views[stmt.view.relname] = stmt.query
        elif isinstance(stmt, ast.CreateFunctionStmt) and stmt.funcname[0].sval == SCHEMA:
            name = stmt.funcname[-1].sval
            if name in functions:
                raise ValueError(f"replaysafe.{name} is overloaded: the check names functions "
                                 "by name alone")
            options = {o.defname: o.arg for o in stmt.options}
            body = options["as"][0].sval
            at = sql.find(body, search_from)
            search_from = max(search_from, at)
            params = [Param(p.name, _type_name(p.argType)) for p in stmt.parameters or ()
                      if p.mode in (enums.FunctionParameterMode.FUNC_PARAM_IN,
                                    enums.FunctionParameterMode.FUNC_PARAM_INOUT,
                                    enums.FunctionParameterMode.FUNC_PARAM_VARIADIC,
                                    enums.FunctionParameterMode.FUNC_PARAM_DEFAULT)]
            functions[name] = Function(name, options["language"].sval.lower(), params, body,
                                       sql.count("\n", 0, at) + 1, stmt)
    with_tenant = {t for t, cols in tables.items() if TENANT_COLUMN in cols}
    for t in sorted(with_tenant - set(key_columns) - set(not_tenant_tables)):
        raise ValueError(f"replaysafe.{t} has a tenant_id column: name its key column (a tenant "
                         "table) or say why it is not a tenant table")
    for t, col in key_columns.items():
        if t not in with_tenant or col not in tables[t]:
            raise ValueError(f"key column {t}.{col}: no such tenant table or column")
    for t in not_tenant_tables:
        if t not in with_tenant or t in key_columns:
            raise ValueError(f"{t} listed as not a tenant table: it has no tenant_id column, "
                             "or is also listed with a key column")
    return Schema(tables, views, functions, dict(key_columns), composite_types)


# ---------------------------------------------------------------------------------------
# What one analysis collects
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    callee: str
    given: dict[str, tuple[Tags, str]]  # callee parameter -> its argument's tags and text
    line: int
    statement: str


@dataclass
class _Acc:
    problems: list[tuple[Rule, str]] = field(default_factory=list)
    calls: list[tuple[str, dict[str, tuple[Tags, str]]]] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)

    def merge(self, other: _Acc) -> None:
        self.problems += other.problems
        self.calls += other.calls
        self.touched |= other.touched


Outputs = list[tuple[str, Tags]]


@dataclass(eq=False)
class _Entry:
    """One relation of a FROM list (or an UPDATE/DELETE/INSERT target)."""

    alias: str
    columns: list[str] | None  # None: unknown (a catalog table, a function without names)
    table: str | None = None  # the tenant table it is
    verb: str = "reads"
    tags: dict[str, Tags] = field(default_factory=dict)
    sub: ast.Node | None = None  # a subquery or view, analysed with the level
    is_view: bool = False
    name: str = ""  # the view's
    lateral: bool = False
    pushdown: bool = False
    colnames: list[str] | None = None  # the alias's column names for a subquery


class _Vars:
    """PL/pgSQL variables: a variable (or field) carries a tag when its initial value (a
    parameter's) and every assignment carry it. Assignments are read from the previous pass
    over the body and written for the next one, from none up, until they are stable."""

    def __init__(self, initial: dict[str, Tags]) -> None:
        self.initial = initial
        self.names: set[str] = {k.split(".")[0] for k in initial}
        self.assigned: dict[str, list[Tags]] = {}
        self.records: dict[str, list[dict[str, Tags]]] = {}
        self.next_assigned: dict[str, list[Tags]] = {}
        self.next_records: dict[str, list[dict[str, Tags]]] = {}

    def tags(self, key: str) -> Tags:
        base, _, fld = key.partition(".")
        seen = list(self.assigned.get(key, []))
        if fld:
            seen += [r.get(fld, EMPTY) for r in self.records.get(base, [])]
        if key in self.initial:
            result = self.initial[key]
        elif seen:
            result = seen[0]
        else:
            return EMPTY
        for t in seen:
            result &= t
        return result

    def assign(self, key: str, tags: Tags) -> None:
        self.next_assigned.setdefault(key, []).append(tags)
        if "." not in key:  # the whole variable: a record's fields too
            self.next_records.setdefault(key, []).append({})

    def assign_record(self, name: str, fields: dict[str, Tags]) -> None:
        self.next_records.setdefault(name, []).append(fields)
        self.next_assigned.setdefault(name, []).append(EMPTY)

    def settle(self) -> bool:
        """Start the next pass; False when this pass assigned what the previous one did."""
        changed = (self.next_assigned, self.next_records) != (self.assigned, self.records)
        self.assigned, self.records = self.next_assigned, self.next_records
        self.next_assigned, self.next_records = {}, {}
        return changed


class _Scope:
    """The relations of one query level, its CTEs, and the levels around it."""

    def __init__(self, checker: _FunctionCheck, parent: _Scope | None, *,
                 in_view: bool = False) -> None:
        self.checker = checker
        self.parent = parent
        self.entries: list[_Entry] = []
        self.ctes: dict[str, Outputs] = {}
        self.in_view = in_view or (parent is not None and parent.in_view)

    def cte(self, name: str) -> Outputs | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.ctes:
                return scope.ctes[name]
            scope = scope.parent
        return None

    def resolve(self, names: Sequence[str]) -> tuple[_Entry, str] | str | None:
        """A column (entry, name), a variable key ("v", "v.f"), or None."""
        scope: _Scope | None = self
        if len(names) == 1:
            while scope is not None:
                for e in scope.entries:
                    if e.columns is not None and names[0] in e.columns:
                        return e, names[0]
                scope = scope.parent
        else:
            while scope is not None:
                for e in scope.entries:
                    if e.alias == names[-2]:
                        return e, names[-1]
                scope = scope.parent
        if self.in_view:
            return None
        vars_ = self.checker.vars
        if names[0] in vars_.names or names[0] in self.checker.variables:
            return ".".join(names[:2])
        if len(names) == 2 and names[0] == self.checker.fn.name and names[1] in vars_.names:
            return names[1]
        return None


def _fields(ref: ast.ColumnRef) -> list[str]:
    return ["*" if isinstance(f, ast.A_Star) else f.sval for f in ref.fields]


def _children(node: Any) -> Iterator[Any]:
    if isinstance(node, (list, tuple)):
        for item in node:
            yield from _children(item)
    elif isinstance(node, ast.Node):
        yield node


def _conjuncts(node: Any) -> Iterator[tuple[ast.Node, ast.Node]]:
    """The equalities among the top-level AND-conjuncts of a condition."""
    if isinstance(node, ast.BoolExpr) and node.boolop == enums.BoolExprType.AND_EXPR:
        for arg in node.args:
            yield from _conjuncts(arg)
    elif (isinstance(node, ast.A_Expr) and node.kind == enums.A_Expr_Kind.AEXPR_OP
          and node.name[-1].sval == "=" and node.lexpr is not None):
        yield node.lexpr, node.rexpr


Side = ast.Node | tuple[_Entry, str] | frozenset[str]


@dataclass
class _Eq:
    left: Side
    right: Side
    into: set[int] | None = None  # ids of the entries it may pin (outer joins); None: all


def _pushdown_safe(node: ast.Node) -> bool:
    """Postgres pushes an outer filter on a column into this subquery."""
    if not isinstance(node, ast.SelectStmt):
        return False
    if node.op != enums.SetOperation.SETOP_NONE or node.limitCount or node.limitOffset:
        return False
    if node.distinctClause and any(d is not None for d in node.distinctClause):  # DISTINCT ON
        return False
    return not any(isinstance(n, ast.FuncCall) and n.over is not None
                   for n in _walk_nodes(node.targetList))


def _walk_nodes(node: Any) -> Iterator[ast.Node]:
    for child in _children(node):
        yield child
        for attr in child:
            yield from _walk_nodes(getattr(child, attr))


# ---------------------------------------------------------------------------------------
# One function
# ---------------------------------------------------------------------------------------


def _required(schema: Schema, param: Param) -> Tags:
    """What a parameter stands for: the tenant, a key, or a pinned row of a tenant table."""
    if param.name == "p_" + TENANT_COLUMN:
        return frozenset({TENANT})
    for col in set(schema.key_columns.values()):
        if param.name == "p_" + col:
            return frozenset({key_tag(col)})
    table = param.type.removeprefix(SCHEMA + ".")
    if param.type.startswith(SCHEMA + ".") and table in schema.key_columns:
        return frozenset({TENANT, key_tag(schema.key_columns[table])})
    return EMPTY


class _FunctionCheck:
    def __init__(self, schema: Schema, fn: Function) -> None:
        self.schema = schema
        self.fn = fn
        self.var_types: dict[str, str] = {}  # declared replaysafe row types
        self.variables: set[str] = set()
        initial: dict[str, Tags] = {}
        for p in fn.params:
            req = _required(schema, p)
            table = p.type.removeprefix(SCHEMA + ".")
            if p.type.startswith(SCHEMA + ".") and table in schema.key_columns:
                self.var_types[p.name] = table
                initial[f"{p.name}.{TENANT_COLUMN}"] = frozenset({TENANT}) & req
                key = schema.key_columns[table]
                initial[f"{p.name}.{key}"] = frozenset({key_tag(key)})
                initial[p.name] = EMPTY
            else:
                initial[p.name] = req
        self.vars = _Vars(initial)
        self.findings: list[Finding] = []
        self.calls: list[_Call] = []
        self.touched: set[str] = set()

    # -- expressions ----------------------------------------------------------------------

    def tags(self, node: Any, scope: _Scope) -> Tags:
        if isinstance(node, ast.ColumnRef):
            target = scope.resolve(_fields(node))
            if isinstance(target, tuple):
                return target[0].tags.get(target[1], EMPTY)
            return self.vars.tags(target) if target is not None else EMPTY
        if isinstance(node, ast.ParamRef) and not scope.in_view:
            if 1 <= node.number <= len(self.fn.params):
                return self.vars.tags(self.fn.params[node.number - 1].name)
            return EMPTY
        if isinstance(node, ast.TypeCast):
            return self.tags(node.arg, scope)
        if isinstance(node, ast.CollateClause):
            return self.tags(node.arg, scope)
        return EMPTY

    def walk(self, node: Any, scope: _Scope, acc: _Acc) -> None:
        """Subqueries and calls inside expressions of one query level."""
        for child in _children(node):
            if isinstance(child, ast.SubLink):
                self.walk(child.testexpr, scope, acc)
                self.statement(child.subselect, scope, acc)
                continue
            if isinstance(child, (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)):
                self.statement(child, scope, acc)
                continue
            if isinstance(child, ast.FuncCall):
                self.call(child, scope, acc)
            for attr in child:
                self.walk(getattr(child, attr), scope, acc)

    def call(self, node: ast.FuncCall, scope: _Scope, acc: _Acc) -> None:
        names = [n.sval for n in node.funcname]
        if len(names) != 2 or names[0] != SCHEMA or names[1] not in self.schema.functions:
            return
        callee = self.schema.functions[names[1]]
        given: dict[str, tuple[Tags, str]] = {}
        for i, arg in enumerate(node.args or ()):
            if isinstance(arg, ast.NamedArgExpr):
                param = next((p for p in callee.params if p.name == arg.name), None)
                arg = arg.arg
            else:
                param = callee.params[i] if i < len(callee.params) else None
            if param is None:
                continue
            table = param.type.removeprefix(SCHEMA + ".")
            if param.type.startswith(SCHEMA + ".") and table in self.schema.key_columns:
                tags = self._row_tags(arg, table, scope)
            else:
                tags = self.tags(arg, scope)
            given[param.name] = (tags, RawStream()(arg))
        acc.calls.append((callee.name, given))

    def _row_tags(self, arg: Any, table: str, scope: _Scope) -> Tags:
        """A row passed as a whole: a variable (or parameter) whose tenant_id and key fields
        are pinned."""
        if not isinstance(arg, ast.ColumnRef):
            return EMPTY
        target = scope.resolve(_fields(arg))
        if not isinstance(target, str) or self.var_types.get(target) != table:
            return EMPTY
        key = self.schema.key_columns[table]
        return (self.vars.tags(f"{target}.{TENANT_COLUMN}") & {TENANT}) | (
            self.vars.tags(f"{target}.{key}") & {key_tag(key)})

    # -- statements -----------------------------------------------------------------------

    def statement(self, node: ast.Node, parent: _Scope | None, acc: _Acc,
                  pushed: Mapping[str, Tags] | None = None, *, in_view: bool = False) -> Outputs:
        if isinstance(node, ast.SelectStmt):
            return self.select(node, parent, acc, pushed, in_view=in_view)
        if isinstance(node, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)):
            return self.dml(node, parent, acc)
        for n in _walk_nodes(node):
            if isinstance(n, ast.RangeVar) and n.schemaname in (None, SCHEMA) \
                    and n.relname in self.schema.key_columns:
                acc.touched.add(n.relname)
                acc.problems.append(("tenant", f"{type(node).__name__} on replaysafe.{n.relname}: "
                                               "not a statement the check can hold to a tenant"))
        self.walk(node, _Scope(self, parent), acc)
        return []

    def _ctes(self, with_clause: ast.WithClause | None, scope: _Scope, acc: _Acc) -> None:
        for cte in (with_clause.ctes if with_clause else ()):
            outs = self.statement(cte.ctequery, scope, acc)
            if cte.aliascolnames:
                outs = [(c.sval, t) for c, (_, t) in zip(cte.aliascolnames, outs, strict=False)]
            scope.ctes[cte.ctename] = outs

    def _entry(self, item: ast.Node, scope: _Scope, eqs: list[_Eq], exprs: list[Any],
               verb: str = "reads") -> list[_Entry]:
        if isinstance(item, ast.RangeVar):
            alias = item.alias.aliasname if item.alias else item.relname
            own = item.schemaname in (None, SCHEMA)
            cte = scope.cte(item.relname) if item.schemaname is None else None
            if cte is not None:
                entry = _Entry(alias, [n for n, _ in cte], tags={n: t for n, t in cte})
            elif own and item.relname in self.schema.views:
                view = self.schema.views[item.relname]
                entry = _Entry(alias, None, sub=view, is_view=True, name=item.relname,
                               pushdown=_pushdown_safe(view))
            elif own and item.relname in self.schema.tables:
                entry = _Entry(alias, list(self.schema.tables[item.relname]), verb=verb,
                               table=item.relname if item.relname in self.schema.key_columns
                               else None)
            else:
                entry = _Entry(alias, None)
            scope.entries.append(entry)
            return [entry]
        if isinstance(item, ast.RangeSubselect):
            alias = item.alias.aliasname if item.alias else "subquery"
            entry = _Entry(alias, None, sub=item.subquery, lateral=bool(item.lateral),
                           pushdown=_pushdown_safe(item.subquery),
                           colnames=[c.sval for c in item.alias.colnames]
                           if item.alias and item.alias.colnames else None)
            scope.entries.append(entry)
            return [entry]
        if isinstance(item, ast.RangeFunction):
            alias = item.alias.aliasname if item.alias else "function"
            if item.alias and item.alias.colnames:
                columns = [c.sval for c in item.alias.colnames]
            elif item.coldeflist:
                columns = [c.colname for c in item.coldeflist]
            else:
                columns = [alias]
            exprs.append(item.functions)
            entry = _Entry(alias, columns)
            scope.entries.append(entry)
            return [entry]
        if isinstance(item, ast.JoinExpr):
            left = self._entry(item.larg, scope, eqs, exprs)
            right = self._entry(item.rarg, scope, eqs, exprs)
            into: set[int] | None = None
            jt = item.jointype
            if jt == enums.JoinType.JOIN_LEFT:
                into = {id(e) for e in right}
            elif jt == enums.JoinType.JOIN_RIGHT:
                into = {id(e) for e in left}
            elif jt != enums.JoinType.JOIN_INNER:
                into = set()
            for lhs, rhs in _conjuncts(item.quals):
                eqs.append(_Eq(lhs, rhs, into))
            for name in (n.sval for n in item.usingClause or ()):
                le = next((e for e in left if e.columns and name in e.columns), None)
                re_ = next((e for e in right if e.columns and name in e.columns), None)
                if le is not None and re_ is not None:
                    eqs.append(_Eq((le, name), (re_, name), into))
            exprs.append(item.quals)
            return left + right
        exprs.append(item)
        return []

    def _side_target(self, side: Side, scope: _Scope) -> tuple[_Entry, str] | None:
        if isinstance(side, tuple):
            return side
        if isinstance(side, ast.ColumnRef):
            target = scope.resolve(_fields(side))
            if isinstance(target, tuple) and any(target[0] is e for e in scope.entries):
                return target
        return None

    def _side_tags(self, side: Side, scope: _Scope) -> Tags:
        if isinstance(side, frozenset):
            return side
        if isinstance(side, tuple):
            return side[0].tags.get(side[1], EMPTY)
        return self.tags(side, scope)

    def _fixpoint(self, scope: _Scope, eqs: list[_Eq]) -> bool:
        grew = False
        changed = True
        while changed:
            changed = False
            for eq in eqs:
                for a, b in ((eq.left, eq.right), (eq.right, eq.left)):
                    target = self._side_target(a, scope)
                    if target is None or (eq.into is not None and id(target[0]) not in eq.into):
                        continue
                    entry, col = target
                    old = entry.tags.get(col, EMPTY)
                    new = old | self._side_tags(b, scope)
                    if new != old:
                        entry.tags[col] = new
                        changed = grew = True
        return grew

    def _level(self, scope: _Scope, eqs: list[_Eq], acc: _Acc) -> None:
        """Pin the level's relations (with its subqueries and views), then check them."""
        subs = [e for e in scope.entries if e.sub is not None]
        final: list[tuple[_Entry, _Acc]] = []
        for _ in range(8):
            final = []
            grew = False
            for e in subs:
                sub_acc = _Acc()
                parent = None if e.is_view else (scope if e.lateral else scope.parent)
                outs = self.statement(e.sub, parent, sub_acc, e.tags if e.pushdown else None,
                                      in_view=e.is_view or scope.in_view)
                final.append((e, sub_acc))
                names = e.colnames or [n for n, _ in outs]
                e.columns = names + [n for n, _ in outs][len(names):]
                for name, (_, t) in zip(e.columns, outs, strict=False):
                    if not t <= e.tags.get(name, EMPTY):
                        e.tags[name] = e.tags.get(name, EMPTY) | t
                        grew = True
            grew = self._fixpoint(scope, eqs) or grew
            if not grew:
                break
        for e, sub_acc in final:
            if e.is_view:
                sub_acc.problems = [(rule, f"through view replaysafe.{e.name}: {p}")
                                    for rule, p in sub_acc.problems]
            acc.merge(sub_acc)
        for e in scope.entries:
            if e.table is None:
                continue
            acc.touched.add(e.table)
            name = f"replaysafe.{e.table}" + (f" (as {e.alias})" if e.alias != e.table else "")
            key = self.schema.key_columns[e.table]
            if TENANT not in e.tags.get(TENANT_COLUMN, EMPTY):
                acc.problems.append(("tenant", f"{e.verb} {name} without {TENANT_COLUMN} = "
                                               f"p_{TENANT_COLUMN}"))
            elif key_tag(key) not in e.tags.get(key, EMPTY):
                acc.problems.append(("key", f"{e.verb} {name} without {key} = p_{key}"))

    def _outputs(self, targets: Any, scope: _Scope) -> Outputs:
        outs: Outputs = []
        for res in targets or ():
            val = res.val
            if isinstance(val, ast.ColumnRef) and isinstance(val.fields[-1], ast.A_Star):
                names = _fields(val)
                for e in scope.entries:
                    if (len(names) == 1 or e.alias == names[-2]) and e.columns:
                        outs += [(c, e.tags.get(c, EMPTY)) for c in e.columns]
                continue
            name = res.name or (_fields(val)[-1] if isinstance(val, ast.ColumnRef) else "?column?")
            outs.append((name, self.tags(val, scope)))
        return outs

    def select(self, node: ast.SelectStmt, parent: _Scope | None, acc: _Acc,
               pushed: Mapping[str, Tags] | None, *, in_view: bool = False) -> Outputs:
        scope = _Scope(self, parent, in_view=in_view)
        self._ctes(node.withClause, scope, acc)
        if node.op != enums.SetOperation.SETOP_NONE:
            left = self.statement(node.larg, scope, acc)
            right = self.statement(node.rarg, scope, acc)
            return [(n, t & u) for (n, t), (_, u) in zip(left, right, strict=False)]
        if node.valuesLists:
            rows = [[self.tags(v, scope) for v in row] for row in node.valuesLists]
            self.walk(node.valuesLists, scope, acc)
            return [(f"column{i + 1}", frozenset.intersection(*col))
                    for i, col in enumerate(zip(*rows, strict=False))]
        eqs: list[_Eq] = []
        exprs: list[Any] = []
        for item in node.fromClause or ():
            self._entry(item, scope, eqs, exprs)
        eqs += [_Eq(lhs, rhs) for lhs, rhs in _conjuncts(node.whereClause)]
        if pushed:
            for res in node.targetList or ():
                if isinstance(res.val, ast.ColumnRef) and not isinstance(res.val.fields[-1], ast.A_Star):
                    name = res.name or _fields(res.val)[-1]
                    if pushed.get(name):
                        eqs.append(_Eq(res.val, pushed[name]))
                elif isinstance(res.val, ast.ColumnRef):  # SELECT *, x.*: each column by name
                    for e in scope.entries:
                        for c in e.columns or ():
                            if pushed.get(c) and (len(res.val.fields) == 1
                                                  or e.alias == _fields(res.val)[-2]):
                                eqs.append(_Eq((e, c), pushed[c]))
        self._level(scope, eqs, acc)
        self.walk([exprs, node.targetList, node.whereClause, node.havingClause, node.groupClause,
                   node.sortClause, node.limitCount, node.limitOffset, node.distinctClause],
                  scope, acc)
        return self._outputs(node.targetList, scope)

    def dml(self, node: ast.InsertStmt | ast.UpdateStmt | ast.DeleteStmt, parent: _Scope | None,
            acc: _Acc) -> Outputs:
        scope = _Scope(self, parent)
        self._ctes(node.withClause, scope, acc)
        returning = node.returningClause.exprs if node.returningClause else None
        if isinstance(node, ast.InsertStmt):
            return self.insert(node, scope, acc, returning)
        eqs: list[_Eq] = []
        exprs: list[Any] = []
        verb = "updates" if isinstance(node, ast.UpdateStmt) else "deletes from"
        self._entry(node.relation, scope, eqs, exprs, verb)
        others = node.fromClause if isinstance(node, ast.UpdateStmt) else node.usingClause
        for item in others or ():
            self._entry(item, scope, eqs, exprs)
        eqs += [_Eq(lhs, rhs) for lhs, rhs in _conjuncts(node.whereClause)]
        self._level(scope, eqs, acc)
        if isinstance(node, ast.UpdateStmt):
            self._sets(scope.entries[0].table, node.targetList, scope, acc)
        self.walk([exprs, node.whereClause, returning,
                   node.targetList if isinstance(node, ast.UpdateStmt) else None], scope, acc)
        return self._outputs(returning, scope)

    def _sets(self, table: str | None, targets: Any, scope: _Scope, acc: _Acc) -> None:
        """An UPDATE's SET may not move a row to another tenant or key."""
        if table not in self.schema.key_columns:
            return
        key = self.schema.key_columns[table]
        for res in targets or ():
            if res.name == TENANT_COLUMN and TENANT not in self.tags(res.val, scope):
                acc.problems.append(("tenant", f"sets {TENANT_COLUMN} of replaysafe.{table} to a "
                                               f"value that is not p_{TENANT_COLUMN}"))
            elif res.name == key and key_tag(key) not in self.tags(res.val, scope):
                acc.problems.append(("key", f"sets {key} of replaysafe.{table} to a value that is "
                                            f"not p_{key}"))

    def insert(self, node: ast.InsertStmt, scope: _Scope, acc: _Acc, returning: Any) -> Outputs:
        rel = node.relation
        table = rel.relname if rel.schemaname in (None, SCHEMA) else None
        columns = self.schema.tables.get(table or "", [])
        cols = [c.name for c in node.cols] if node.cols else list(columns)
        values: list[Tags]
        sel = node.selectStmt
        if sel is None:
            values = [EMPTY] * len(cols)
        elif isinstance(sel, ast.SelectStmt) and sel.valuesLists and not sel.fromClause:
            rows = [[self.tags(v, scope) for v in row] for row in sel.valuesLists]
            self.walk(sel.valuesLists, scope, acc)
            values = [frozenset.intersection(*col) for col in zip(*rows, strict=False)]
        else:
            values = [t for _, t in self.statement(sel, scope, acc)]
        given = dict(zip(cols, values, strict=False))
        if table in self.schema.key_columns:
            acc.touched.add(table)
            key = self.schema.key_columns[table]
            if TENANT not in given.get(TENANT_COLUMN, EMPTY):
                acc.problems.append(("tenant", f"inserts into replaysafe.{table} a {TENANT_COLUMN} "
                                               f"that is not p_{TENANT_COLUMN}"))
            elif key_tag(key) not in given.get(key, EMPTY):
                acc.problems.append(("key", f"inserts into replaysafe.{table} a {key} that is not "
                                            f"p_{key}"))
        # ON CONFLICT and RETURNING see the row inserted (or the one it ran into: same key).
        target = _Entry(rel.alias.aliasname if rel.alias else rel.relname, cols, tags=given)
        scope.entries += [target, _Entry("excluded", cols, tags=given)]
        conflict = node.onConflictClause
        if conflict is not None:
            self._sets(table, conflict.targetList, scope, acc)
            self.walk([conflict.targetList, conflict.whereClause], scope, acc)
        self.walk(returning, scope, acc)
        return self._outputs(returning, scope)

    # -- the function's body --------------------------------------------------------------

    def run(self) -> None:
        if self.fn.language == "sql":
            units = [_Unit(self.fn.body_line + self.fn.body.count("\n", 0, s.stmt_location),
                           "sql", self.fn.body[s.stmt_location:s.stmt_location + (s.stmt_len or
                                                                                 len(self.fn.body))],
                           0, None, False)
                     for s in parse_sql(self.fn.body)]
        elif self.fn.language == "plpgsql":
            units = self._plpgsql_units()
        else:
            return
        for _ in range(10):
            self.findings, self.calls, self.touched = [], [], set()
            for unit in units:
                self._unit(unit)
            if not self.vars.settle():
                break

    def _unit(self, unit: _Unit) -> None:
        acc = _Acc()
        outs: Outputs = []
        text = unit.text
        if unit.dynamic:
            consts = _constant_string(text)
            if consts is None:
                acc.problems.append(("tenant", "dynamic SQL (EXECUTE of a computed string) cannot "
                                               "be checked statically"))
            else:
                for stmt in parse_sql(consts):
                    self.statement(stmt.stmt, None, acc)
        else:
            sql, target = _as_sql(text, unit.mode)
            for raw in parse_sql(sql):
                outs = self.statement(raw.stmt, None, acc)
            if target is not None:
                self._assign([target], outs[:1])
        if unit.target is not None:
            self._assign_target(unit.target, outs)
        statement = _KEYWORDS.get(unit.kind, "") * (unit.mode == 2) + _one_line(text)
        for rule, problem in acc.problems:
            self.findings.append(Finding(self.fn.name, rule, unit.line, statement, problem))
        for callee, given in acc.calls:
            self.calls.append(_Call(callee, given, unit.line, statement))
        self.touched |= acc.touched

    def _assign(self, keys: Sequence[str], outs: Outputs) -> None:
        for i, key in enumerate(keys):
            self.vars.assign(key, outs[i][1] if i < len(outs) else EMPTY)

    def _assign_target(self, target: dict[str, Any], outs: Outputs) -> None:
        kind, data = next(iter(target.items()))
        if kind == "PLpgSQL_rec":
            name = data["refname"]
            table = self.var_types.get(name)
            if table is not None:  # a row type: by position
                cols = self.schema.tables[table]
                self.vars.assign_record(name, {c: outs[i][1] for i, c in enumerate(cols)
                                               if i < len(outs)})
            else:  # a record: by name
                self.vars.assign_record(name, dict(outs))
        elif kind == "PLpgSQL_row":
            self._assign([f["name"] for f in data["fields"]], outs)
        elif kind == "PLpgSQL_var":
            self._assign([data["refname"]], outs)

    def _plpgsql_units(self) -> list[_Unit]:
        node = ast.CreateFunctionStmt(self.fn.node())  # a copy, types made parseable
        # libpg_query's PL/pgSQL parser looks up no schema but public and pg_catalog, and
        # takes every type it does not know for a record: a row stays one, the rest is text.
        rows = set(self.schema.tables) | set(self.schema.views) | self.schema.composite_types
        body, types = _declarations(self.fn.body, rows)
        self.var_types.update({v: t for v, t in types.items() if t in self.schema.tables})
        for n in _walk_nodes(node):
            if isinstance(n, ast.TypeName) and len(n.names) == 2 and n.names[0].sval == SCHEMA:
                n.names = ((ast.String(sval="public"), n.names[1]) if n.names[1].sval in rows
                           else (ast.String(sval="text"),))
        for opt in node.options:
            if opt.defname == "as":
                opt.arg = (ast.String(sval=body),)
        try:
            tree = json.loads(parse_plpgsql_json(RawStream()(node)))[0]["PLpgSQL_function"]
        except ParseError as exc:
            raise ValueError(f"replaysafe.{self.fn.name}: PL/pgSQL parser: {exc}") from exc
        datums = tree.get("datums", [])
        names = [next(iter(d.values())).get("refname", "") for d in datums]
        self.variables = {n for n in names if n and not n.startswith("(")}
        self.vars.names |= self.variables
        units: list[_Unit] = []
        defaults: list[_Unit] = []
        for d in datums:
            kind, data = next(iter(d.items()))
            if kind == "PLpgSQL_var" and "default_val" in data:
                expr = data["default_val"]["PLpgSQL_expr"]
                defaults.append(_Unit(self.fn.body_line + data.get("lineno", 1) - 1, "default",
                                      f"{data['refname']} := {expr['query']}", 3, None, False))
        _collect(tree["action"], None, 0, names, units, self.fn.body_line)
        return defaults + units


@dataclass(frozen=True)
class _Unit:
    line: int
    kind: str
    text: str
    mode: int  # PL/pgSQL's parse mode: 0 a statement, 2 an expression, 3-5 an assignment
    target: dict[str, Any] | None  # INTO / FOR target
    dynamic: bool


_DYNAMIC = {"PLpgSQL_stmt_dynexecute", "PLpgSQL_stmt_dynfors"}
# For messages: the statement an expression belongs to.
_KEYWORDS = {"PLpgSQL_stmt_return": "RETURN ", "PLpgSQL_stmt_if": "IF ",
             "PLpgSQL_stmt_dynexecute": "EXECUTE ", "PLpgSQL_stmt_return_query": "RETURN QUERY ",
             "PLpgSQL_stmt_return_next": "RETURN NEXT ", "PLpgSQL_stmt_exit": "EXIT/CONTINUE WHEN ",
             "PLpgSQL_stmt_raise": "RAISE ... ", "PLpgSQL_stmt_dynfors": "FOR ... IN EXECUTE "}


def _collect(node: Any, stmt: str | None, lineno: int, names: list[str], out: list[_Unit],
             base: int) -> None:
    if isinstance(node, list):
        for item in node:
            _collect(item, stmt, lineno, names, out, base)
        return
    if not isinstance(node, dict):
        return
    for kind, data in node.items():
        if kind == "PLpgSQL_expr":
            out.append(_Unit(base + lineno - 1, stmt or "", data["query"], data.get("parseMode", 0),
                             None, stmt in _DYNAMIC))
            continue
        if not kind.startswith("PLpgSQL_stmt_") or not isinstance(data, dict):
            _collect(data, stmt, lineno, names, out, base)
            continue
        line = data.get("lineno", lineno)
        target = data.get("target") if data.get("into") else None
        if kind == "PLpgSQL_stmt_fors":
            target = data.get("var")
        for attr, value in data.items():
            if attr in ("target", "var"):
                continue
            if isinstance(value, dict) and "PLpgSQL_expr" in value:
                expr = value["PLpgSQL_expr"]
                dynamic = kind in _DYNAMIC or attr == "dynquery"
                main = attr in ("sqlstmt", "query") and not dynamic
                out.append(_Unit(base + line - 1, kind, expr["query"], expr.get("parseMode", 0),
                                 target if main else None, dynamic))
                if dynamic and target is not None:  # EXECUTE ... INTO: unknown values
                    out.append(_Unit(base + line - 1, kind, "NULL", 2, target, False))
            else:
                _collect(value, kind, line, names, out, base)
        if kind == "PLpgSQL_stmt_getdiag":
            for item in data.get("diag_items", []):
                dno = item["PLpgSQL_diag_item"]["target"]
                out.append(_Unit(base + line - 1, kind, f"{names[dno]} := NULL", 3, None, False))
        if kind in ("PLpgSQL_stmt_foreach_a", "PLpgSQL_stmt_fori") and isinstance(
                data.get("var"), dict):
            var = next(iter(data["var"].values())).get("refname")
            if var:
                out.append(_Unit(base + line - 1, kind, f"{var} := NULL", 3, None, False))


_DECL = re.compile(r"^(\s*)(\"?[A-Za-z_]\w*\"?)(\s+(?:CONSTANT\s+)?)replaysafe\.(\w+)(%rowtype)?(\[\])?",
                   re.IGNORECASE | re.MULTILINE)


def _declarations(body: str, rows: Collection[str]) -> tuple[str, dict[str, str]]:
    """The body with its DECLARE section's replaysafe types made parseable (see
    _plpgsql_units), and the row types declared."""
    begin = re.search(r"^\s*BEGIN\b", body, re.IGNORECASE | re.MULTILINE)
    head, rest = (body[:begin.start()], body[begin.start():]) if begin else ("", body)
    types: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        if m.group(6) or m.group(4).lower() not in rows:  # arrays: never a row either
            return f"{m.group(1)}{m.group(2)}{m.group(3)}text{m.group(6) or ''}"
        types[m.group(2).strip('"').lower()] = m.group(4).lower()
        return f"{m.group(1)}{m.group(2)}{m.group(3)}public.{m.group(4)}{m.group(5) or ''}"

    return _DECL.sub(sub, head) + rest, types


def _as_sql(text: str, mode: int) -> tuple[str, str | None]:
    """A PL/pgSQL expression as SQL to parse, and the variable an assignment assigns."""
    if mode == 0:
        return text, None
    if mode == 2:
        return "SELECT " + text, None
    depth = 0
    for tok in scan(text):
        if tok.name in ("ASCII_40", "ASCII_91"):
            depth += 1
        elif tok.name in ("ASCII_41", "ASCII_93"):
            depth -= 1
        elif depth == 0 and tok.name in ("COLON_EQUALS", "ASCII_61"):
            lhs = text[:tok.start]
            target = re.sub(r"\[.*\]", "", lhs).replace('"', "").replace(" ", "").lower()
            return "SELECT " + text[tok.end + 1:], target
    raise ValueError(f"cannot find the assignment in {text!r}")


def _one_line(text: str) -> str:
    """The statement for a message: on one line, without its comments."""
    out, end = [], 0
    for tok in scan(text):
        if tok.name in ("SQL_COMMENT", "C_COMMENT"):
            continue
        if out and tok.start > end:
            out.append(" ")
        out.append(text[tok.start:tok.end + 1])
        end = tok.end + 1
    return "".join(out)


def _constant_string(text: str) -> str | None:
    stmt = parse_sql("SELECT " + text)[0].stmt
    val = stmt.targetList[0].val if isinstance(stmt, ast.SelectStmt) else None
    if isinstance(val, ast.A_Const) and isinstance(val.val, ast.String):
        return val.val.sval
    return None


# ---------------------------------------------------------------------------------------
# The whole schema
# ---------------------------------------------------------------------------------------


def check_schema(sql: str, *, key_columns: Mapping[str, str],
                 not_tenant_tables: Collection[str]) -> dict[str, list[Finding]]:
    """Every replaysafe function's findings (an empty list: single-key)."""
    schema = load_schema(sql, key_columns=key_columns, not_tenant_tables=not_tenant_tables)
    checks: dict[str, _FunctionCheck] = {}
    for fn in schema.functions.values():
        check = _FunctionCheck(schema, fn)
        check.run()
        checks[fn.name] = check

    # What each function touches, through its calls too.
    touched = {name: set(c.touched) for name, c in checks.items()}
    grew = True
    while grew:
        grew = False
        for name, c in checks.items():
            for call in c.calls:
                if not touched[call.callee] <= touched[name]:
                    touched[name] |= touched[call.callee]
                    grew = True

    findings = {name: list(c.findings) for name, c in checks.items()}
    for name, c in checks.items():
        for call in c.calls:
            if not touched[call.callee]:
                continue
            keys = {key_tag(key_columns[t]) for t in touched[call.callee]}
            for param in schema.functions[call.callee].params:
                need = _required(schema, param) & ({TENANT} | keys)
                have, text = call.given.get(param.name, (EMPTY, "nothing"))
                missing = need - have
                passing = f"calls replaysafe.{call.callee} passing {text} as {param.name}"
                if TENANT in missing:
                    findings[name].append(Finding(name, "tenant", call.line, call.statement,
                                                  f"{passing}: not the tenant"))
                elif missing:
                    findings[name].append(Finding(name, "key", call.line, call.statement,
                                                  f"{passing}: not the key"))

    # A function is no better than what it calls.
    changed = True
    while changed:
        changed = False
        for name, c in checks.items():
            for call in c.calls:
                if call.callee == name:
                    continue
                callee = verdict(findings[call.callee])
                if callee == "single-key":
                    continue
                rule: Rule = "tenant" if callee == "multi-tenant" else "key"
                problem = f"calls replaysafe.{call.callee}, which is {callee}"
                if not any(f.problem == problem and f.line == call.line for f in findings[name]):
                    findings[name].append(Finding(name, rule, call.line, call.statement, problem))
                    changed = True
    return findings
