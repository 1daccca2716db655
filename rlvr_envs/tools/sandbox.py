"""A stateful tool sandbox: one in-memory SQLite database per episode, populated from a seed.

``Sandbox.call`` is the only way tools touch the state: the call's tool must be one the episode exposes, its arguments
must validate against the tool's JSON schema (strict types: ``5.0`` is not an integer, ``true`` is not a number), and
the tool runs inside a savepoint that is rolled back on any failure, so an invalid or failing call leaves the state
byte-for-byte intact. ``digest()`` hashes the whole state (the outcome check compares it with the ground truth's).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import jsonschema
import numpy as np

from rlvr_envs.tools.services import TOOLS, ToolFailure
from rlvr_envs.verifiers.calls import ToolCall

SCHEMA = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, email TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, category TEXT NOT NULL,
    price_cents INTEGER NOT NULL CHECK (price_cents > 0), stock INTEGER NOT NULL CHECK (stock >= 0));
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
    product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL CHECK (quantity > 0),
    total_cents INTEGER NOT NULL, status TEXT NOT NULL CHECK (status IN ('pending', 'shipped', 'delivered', 'cancelled')));
CREATE TABLE events (id INTEGER PRIMARY KEY, title TEXT NOT NULL, date TEXT NOT NULL, start_time TEXT NOT NULL,
    duration_minutes INTEGER NOT NULL CHECK (duration_minutes > 0));
CREATE TABLE attendees (event_id INTEGER NOT NULL REFERENCES events(id), name TEXT NOT NULL, UNIQUE (event_id, name));
CREATE TABLE files (path TEXT PRIMARY KEY, content TEXT NOT NULL);
"""
TABLES = ("customers", "products", "orders", "events", "attendees", "files")
MAX_RESULT_CHARS = 6000

FIRST = ("Ava", "Ben", "Chloe", "Diego", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Liam", "Maya",
         "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sven", "Tara")
LAST = ("Alvarez", "Brooks", "Chen", "Dubois", "Eriksen", "Fischer", "Garcia", "Hughes", "Ivanova", "Jensen", "Kowalski",
        "Lindqvist", "Moreau", "Nakamura", "Okafor", "Patel")
CITIES = ("Lisbon", "Denver", "Osaka", "Nairobi", "Toronto", "Munich", "Austin", "Seoul")
# No product name contains another, so a search by full name finds exactly one product.
CATALOG = (("Desk Lamp", "home"), ("Espresso Grinder", "kitchen"), ("Trail Backpack", "outdoor"), ("Yoga Mat", "fitness"),
           ("Wireless Mouse", "electronics"), ("Cast Iron Skillet", "kitchen"), ("Rain Jacket", "outdoor"),
           ("Bluetooth Speaker", "electronics"), ("Ceramic Teapot", "kitchen"), ("Standing Desk", "office"),
           ("Notebook Set", "office"), ("Kettlebell", "fitness"), ("Camping Stove", "outdoor"), ("USB-C Hub", "electronics"),
           ("Throw Blanket", "home"), ("Water Bottle", "fitness"))
EVENT_TITLES = ("Budget review", "Design sync", "Quarterly planning", "Vendor call", "Team lunch", "Hiring panel",
                "Product demo", "Retro", "Security training", "Customer interview", "Roadmap workshop", "Board prep")
COLLEAGUES = ("Sam", "Alex", "Jordan", "Robin", "Casey", "Morgan", "Jamie", "Taylor")
FOLDERS = ("/docs", "/notes", "/reports")
FILE_STEMS = ("readme", "todo", "minutes", "summary", "draft", "plan", "ideas", "checklist", "log", "budget")
SENTENCES = ("Ship the spring catalog by Friday.", "Call the supplier about delayed kettles.",
             "Inventory count is due at month end.", "Remember to update the returns policy.",
             "Marketing wants new product photos.", "Move the team offsite to April.",
             "Renew the warehouse lease.", "Draft the customer newsletter.")
DATES = tuple(f"2025-03-{d:02d}" for d in range(3, 15))
TIMES = tuple(f"{h:02d}:{m:02d}" for h in range(9, 17) for m in (0, 30))


# JSON-schema validation in which integers are ints (not 5.0, not True) and numbers are not booleans.
_STRICT_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many({
    "integer": lambda _, v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda _, v: isinstance(v, (int, float)) and not isinstance(v, bool),
})
_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_STRICT_TYPES)
VALIDATORS = {name: _Validator(t.parameters) for name, t in TOOLS.items()}


@dataclass(frozen=True)
class CallResult:
    """``status``: "ok", "invalid" (unknown tool or arguments that break the schema) or "failed" (a domain error)."""

    call: ToolCall | None
    status: str
    content: str  # JSON text shown to the model

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def error_result(call: ToolCall | None, status: str, message: str) -> CallResult:
    return CallResult(call, status, json.dumps({"error": message}, ensure_ascii=False))


class Sandbox:
    """The episode's world. Build one with ``Sandbox.generate(seed)``; ``clone()`` copies it (for ground-truth runs)."""

    def __init__(self, conn: sqlite3.Connection):
        conn.row_factory = sqlite3.Row
        conn.isolation_level = None  # we manage transactions with savepoints
        conn.execute("PRAGMA foreign_keys = ON")
        self.conn = conn

    # -- construction ----------------------------------------------------------------------------------------------
    @classmethod
    def generate(cls, seed: int, *, n_customers: int = 12, n_products: int = 10, n_orders: int = 18,
                 n_events: int = 10, n_files: int = 9) -> Sandbox:
        rng = np.random.default_rng(seed)
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        conn.executescript(SCHEMA)
        pick = lambda seq, k: [seq[i] for i in rng.choice(len(seq), size=k, replace=False)]  # noqa: E731
        names = pick([f"{f} {last}" for f in FIRST for last in LAST], n_customers)
        customers = [(101 + i, n, f"{n.split()[0].lower()}.{n.split()[1].lower()}@example.com", CITIES[rng.integers(len(CITIES))])
                     for i, n in enumerate(names)]
        conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?)", customers)
        products = [(501 + i, name, cat, int(rng.integers(5, 200)) * 100 - int(rng.choice([1, 5, 50, 100])), int(rng.integers(0, 40)))
                    for i, (name, cat) in enumerate(pick(CATALOG, n_products))]
        conn.executemany("INSERT INTO products VALUES (?, ?, ?, ?, ?)", products)
        orders = []
        for i in range(n_orders):
            cust, prod = customers[rng.integers(n_customers)], products[rng.integers(n_products)]
            q = int(rng.integers(1, 5))
            status = ("pending", "pending", "shipped", "delivered", "cancelled")[rng.integers(5)]
            orders.append((1001 + i, cust[0], prod[0], q, q * prod[3], status))
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)", orders)
        for i, title in enumerate(pick(EVENT_TITLES, n_events)):
            conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", (i + 1, title, DATES[rng.integers(len(DATES))],
                         TIMES[rng.integers(len(TIMES))], int(rng.choice([30, 45, 60, 90]))))
            conn.executemany("INSERT INTO attendees VALUES (?, ?)",
                             [(i + 1, n) for n in pick(COLLEAGUES, int(rng.integers(1, 4)))])
        paths = [f"{FOLDERS[rng.integers(len(FOLDERS))]}/{stem}.txt" for stem in pick(FILE_STEMS, n_files)]
        conn.executemany("INSERT INTO files VALUES (?, ?)",
                         [(p, " ".join(pick(SENTENCES, int(rng.integers(1, 3))))) for p in paths])
        conn.commit()
        return cls(conn)

    def clone(self) -> Sandbox:
        copy = sqlite3.connect(":memory:", check_same_thread=False)
        self.conn.backup(copy)
        return Sandbox(copy)

    def close(self) -> None:
        self.conn.close()

    # -- tool calls ------------------------------------------------------------------------------------------------
    def call(self, call: ToolCall, allowed: Collection[str] | None = None) -> CallResult:
        """Run one tool call. Never raises for model input; the state changes only when the result is "ok"."""
        tool = TOOLS.get(call.name)
        if tool is None or (allowed is not None and call.name not in allowed):
            return error_result(call, "invalid", f"unknown tool {call.name[:80]!r}")
        errors = sorted(VALIDATORS[call.name].iter_errors(call.arguments), key=lambda e: list(e.path))
        if errors:
            where = "/".join(map(str, errors[0].path)) or "arguments"
            return error_result(call, "invalid", f"{call.name}: {where}: {errors[0].message[:200]}")
        self.conn.execute("SAVEPOINT tool_call")
        try:
            value = tool.fn(self.conn, **call.arguments)
            content = json.dumps(value, ensure_ascii=False)
        except ToolFailure as exc:
            self.conn.execute("ROLLBACK TO tool_call")
            self.conn.execute("RELEASE tool_call")
            return error_result(call, "failed", str(exc))
        except sqlite3.Error as exc:  # a constraint the schema did not catch: report it, keep the state
            self.conn.execute("ROLLBACK TO tool_call")
            self.conn.execute("RELEASE tool_call")
            return error_result(call, "failed", f"{call.name}: rejected by the database ({type(exc).__name__})")
        self.conn.execute("RELEASE tool_call")
        if len(content) > MAX_RESULT_CHARS:
            content = content[:MAX_RESULT_CHARS] + " ...[truncated]"
        return CallResult(call, "ok", content)

    # -- inspection ------------------------------------------------------------------------------------------------
    def rows(self, table: str) -> list[tuple[Any, ...]]:
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}")
        return [tuple(r) for r in self.conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2")]

    def query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        """Read-only helper for query synthesis and tests (trusted SQL only)."""
        return self.conn.execute(sql, args).fetchall()

    def digest(self) -> str:
        """A hash of every row of every table: two sandboxes with equal digests hold the same state."""
        h = hashlib.sha256()
        for table in TABLES:
            h.update(json.dumps([table, sorted(self.rows(table))], ensure_ascii=False).encode())
        return h.hexdigest()

    def integrity_problems(self) -> list[str]:
        """Empty when the database is sound: SQLite's own check, foreign keys, and the schema unchanged."""
        problems = []
        ok = self.conn.execute("PRAGMA integrity_check").fetchone()[0]
        if ok != "ok":
            problems.append(f"integrity_check: {ok}")
        if self.conn.execute("PRAGMA foreign_key_check").fetchall():
            problems.append("foreign key violations")
        tables = sorted(r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        if tables != sorted(TABLES):
            problems.append(f"tables changed: {tables}")
        if self.conn.in_transaction:
            problems.append("a transaction was left open")
        return problems
