"""The sandbox's services (a shop, a calendar, a file store) and their typed tools.

Every tool is a JSON-schema-typed function over the episode's SQLite connection. Tools run only fixed, parameterised
SQL (argument text is data, never SQL), and raise ``ToolFailure`` for domain errors (unknown id, not enough stock);
the sandbox rolls the call back in that case, so a failed call never changes the state.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SERVICES = ("shop", "calendar", "files")
ORDER_STATUSES = ("pending", "shipped", "delivered", "cancelled")


class ToolFailure(Exception):
    """A domain error reported to the model as ``{"error": ...}`` (the call was well-formed but cannot be done)."""


@dataclass(frozen=True)
class Tool:
    name: str
    service: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    mutates: bool
    fn: Callable[..., Any]

    def schema(self) -> dict[str, Any]:
        """The OpenAI / transformers ``tools=`` form."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


TOOLS: dict[str, Tool] = {}

# Argument types shared by several tools. Bounds keep every value inside SQLite's integer range and short.
_ID = {"type": "integer", "minimum": 1, "maximum": 1_000_000}
_NAME = {"type": "string", "minLength": 1, "maxLength": 80}
_DATE = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "description": "YYYY-MM-DD"}
_TIME = {"type": "string", "pattern": r"^([01]\d|2[0-3]):[0-5]\d$", "description": "HH:MM, 24-hour"}
_PATH = {"type": "string", "pattern": r"^(/[A-Za-z0-9_.\-]{1,40}){1,4}$", "description": "absolute path like /docs/a.txt"}
_EMAIL = {"type": "string", "pattern": r"^[A-Za-z0-9._%+\-]{1,40}@[A-Za-z0-9.\-]{1,40}\.[A-Za-z]{2,10}$"}


def tool(name: str, service: str, description: str, properties: dict[str, Any], required: list[str],
         *, mutates: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in TOOLS:
            raise ValueError(f"duplicate tool {name}")
        params = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
        TOOLS[name] = Tool(name, service, description, params, mutates, fn)
        return fn
    return register


def _dollars(cents: int) -> float:
    return round(cents / 100.0, 2)


def _one(db: sqlite3.Connection, sql: str, args: tuple, what: str) -> sqlite3.Row:
    row = db.execute(sql, args).fetchone()
    if row is None:
        raise ToolFailure(f"{what} not found")
    return row


# -- shop ------------------------------------------------------------------------------------------------------------
def _customer(row: sqlite3.Row) -> dict[str, Any]:
    return {"customer_id": row["id"], "name": row["name"], "email": row["email"], "city": row["city"]}


def _product(row: sqlite3.Row) -> dict[str, Any]:
    return {"product_id": row["id"], "name": row["name"], "category": row["category"],
            "price": _dollars(row["price_cents"]), "stock": row["stock"]}


def _order(row: sqlite3.Row) -> dict[str, Any]:
    return {"order_id": row["id"], "customer_id": row["customer_id"], "product_id": row["product_id"],
            "product": row["product"], "quantity": row["quantity"], "total": _dollars(row["total_cents"]),
            "status": row["status"]}


@tool("find_customers", "shop", "Find customers whose name (or city) contains the given text (case-insensitive).",
      {"name": {**_NAME, "description": "part of the customer's name"}, "city": _NAME}, [])
def find_customers(db: sqlite3.Connection, name: str = "", city: str = "") -> list[dict[str, Any]]:
    rows = db.execute("SELECT * FROM customers WHERE instr(lower(name), lower(?)) > 0 AND instr(lower(city), lower(?)) > 0"
                      " ORDER BY id", (name, city)).fetchall()
    return [_customer(r) for r in rows]


@tool("get_customer", "shop", "Get one customer by id.", {"customer_id": _ID}, ["customer_id"])
def get_customer(db: sqlite3.Connection, customer_id: int) -> dict[str, Any]:
    return _customer(_one(db, "SELECT * FROM customers WHERE id = ?", (customer_id,), f"customer {customer_id}"))


@tool("update_customer_email", "shop", "Change a customer's email address.",
      {"customer_id": _ID, "email": _EMAIL}, ["customer_id", "email"], mutates=True)
def update_customer_email(db: sqlite3.Connection, customer_id: int, email: str) -> dict[str, Any]:
    _one(db, "SELECT id FROM customers WHERE id = ?", (customer_id,), f"customer {customer_id}")
    db.execute("UPDATE customers SET email = ? WHERE id = ?", (email, customer_id))
    return get_customer(db, customer_id)


@tool("search_products", "shop", "Search the catalog by name text and/or category; returns price and stock.",
      {"query": {**_NAME, "description": "part of the product name"}, "category": _NAME,
       "max_price": {"type": "number", "minimum": 0, "maximum": 1_000_000}}, [])
def search_products(db: sqlite3.Connection, query: str = "", category: str = "",
                    max_price: float | None = None) -> list[dict[str, Any]]:
    rows = db.execute("SELECT * FROM products WHERE instr(lower(name), lower(?)) > 0 AND instr(lower(category), lower(?)) > 0"
                      " ORDER BY id", (query, category)).fetchall()
    return [_product(r) for r in rows if max_price is None or r["price_cents"] <= round(max_price * 100)]


@tool("get_product", "shop", "Get one product by id.", {"product_id": _ID}, ["product_id"])
def get_product(db: sqlite3.Connection, product_id: int) -> dict[str, Any]:
    return _product(_one(db, "SELECT * FROM products WHERE id = ?", (product_id,), f"product {product_id}"))


@tool("restock_product", "shop", "Add units to a product's stock.",
      {"product_id": _ID, "quantity": {"type": "integer", "minimum": 1, "maximum": 10_000}},
      ["product_id", "quantity"], mutates=True)
def restock_product(db: sqlite3.Connection, product_id: int, quantity: int) -> dict[str, Any]:
    _one(db, "SELECT id FROM products WHERE id = ?", (product_id,), f"product {product_id}")
    db.execute("UPDATE products SET stock = stock + ? WHERE id = ?", (quantity, product_id))
    return get_product(db, product_id)


_ORDER_SQL = "SELECT o.*, p.name AS product FROM orders o JOIN products p ON p.id = o.product_id"


@tool("list_orders", "shop", "List a customer's orders, optionally only those with a given status.",
      {"customer_id": _ID, "status": {"type": "string", "enum": list(ORDER_STATUSES)}}, ["customer_id"])
def list_orders(db: sqlite3.Connection, customer_id: int, status: str | None = None) -> list[dict[str, Any]]:
    _one(db, "SELECT id FROM customers WHERE id = ?", (customer_id,), f"customer {customer_id}")
    rows = db.execute(f"{_ORDER_SQL} WHERE o.customer_id = ? AND (? IS NULL OR o.status = ?) ORDER BY o.id",
                      (customer_id, status, status)).fetchall()
    return [_order(r) for r in rows]


@tool("get_order", "shop", "Get one order by id.", {"order_id": _ID}, ["order_id"])
def get_order(db: sqlite3.Connection, order_id: int) -> dict[str, Any]:
    return _order(_one(db, f"{_ORDER_SQL} WHERE o.id = ?", (order_id,), f"order {order_id}"))


@tool("place_order", "shop", "Place a pending order for a customer; takes the units from stock.",
      {"customer_id": _ID, "product_id": _ID, "quantity": {"type": "integer", "minimum": 1, "maximum": 100}},
      ["customer_id", "product_id", "quantity"], mutates=True)
def place_order(db: sqlite3.Connection, customer_id: int, product_id: int, quantity: int) -> dict[str, Any]:
    _one(db, "SELECT id FROM customers WHERE id = ?", (customer_id,), f"customer {customer_id}")
    product = _one(db, "SELECT * FROM products WHERE id = ?", (product_id,), f"product {product_id}")
    if product["stock"] < quantity:
        raise ToolFailure(f"only {product['stock']} units of {product['name']} in stock")
    db.execute("UPDATE products SET stock = stock - ? WHERE id = ?", (quantity, product_id))
    cur = db.execute("INSERT INTO orders (id, customer_id, product_id, quantity, total_cents, status) "
                     "VALUES ((SELECT COALESCE(MAX(id), 1000) + 1 FROM orders), ?, ?, ?, ?, 'pending')",
                     (customer_id, product_id, quantity, quantity * product["price_cents"]))
    return get_order(db, cur.lastrowid)


@tool("cancel_order", "shop", "Cancel a pending order and return its units to stock.", {"order_id": _ID}, ["order_id"],
      mutates=True)
def cancel_order(db: sqlite3.Connection, order_id: int) -> dict[str, Any]:
    order = _one(db, "SELECT * FROM orders WHERE id = ?", (order_id,), f"order {order_id}")
    if order["status"] != "pending":
        raise ToolFailure(f"order {order_id} is {order['status']}; only pending orders can be cancelled")
    db.execute("UPDATE orders SET status = 'cancelled' WHERE id = ?", (order_id,))
    db.execute("UPDATE products SET stock = stock + ? WHERE id = ?", (order["quantity"], order["product_id"]))
    return get_order(db, order_id)


# -- calendar --------------------------------------------------------------------------------------------------------
def _event(db: sqlite3.Connection, row: sqlite3.Row) -> dict[str, Any]:
    names = [r[0] for r in db.execute("SELECT name FROM attendees WHERE event_id = ? ORDER BY name", (row["id"],))]
    return {"event_id": row["id"], "title": row["title"], "date": row["date"], "start_time": row["start_time"],
            "duration_minutes": row["duration_minutes"], "attendees": names}


@tool("list_events", "calendar", "List the events on a date.", {"date": _DATE}, ["date"])
def list_events(db: sqlite3.Connection, date: str) -> list[dict[str, Any]]:
    rows = db.execute("SELECT * FROM events WHERE date = ? ORDER BY start_time, id", (date,)).fetchall()
    return [_event(db, r) for r in rows]


@tool("find_events", "calendar", "Find events whose title contains the text and/or that a person attends.",
      {"title": _NAME, "attendee": _NAME}, [])
def find_events(db: sqlite3.Connection, title: str = "", attendee: str = "") -> list[dict[str, Any]]:
    rows = db.execute("SELECT * FROM events WHERE instr(lower(title), lower(?)) > 0 AND (? = '' OR id IN "
                      "(SELECT event_id FROM attendees WHERE instr(lower(name), lower(?)) > 0)) ORDER BY date, start_time, id",
                      (title, attendee, attendee)).fetchall()
    return [_event(db, r) for r in rows]


@tool("create_event", "calendar", "Create a calendar event.",
      {"title": _NAME, "date": _DATE, "start_time": _TIME,
       "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 480},
       "attendees": {"type": "array", "items": _NAME, "maxItems": 10}},
      ["title", "date", "start_time", "duration_minutes"], mutates=True)
def create_event(db: sqlite3.Connection, title: str, date: str, start_time: str, duration_minutes: int,
                 attendees: list[str] | None = None) -> dict[str, Any]:
    cur = db.execute("INSERT INTO events (id, title, date, start_time, duration_minutes) VALUES "
                     "((SELECT COALESCE(MAX(id), 0) + 1 FROM events), ?, ?, ?, ?)", (title, date, start_time, duration_minutes))
    db.executemany("INSERT INTO attendees (event_id, name) VALUES (?, ?)",
                   [(cur.lastrowid, n) for n in sorted(set(attendees or []))])
    return _event(db, _one(db, "SELECT * FROM events WHERE id = ?", (cur.lastrowid,), "event"))


@tool("reschedule_event", "calendar", "Move an event to a new date and start time.",
      {"event_id": _ID, "date": _DATE, "start_time": _TIME}, ["event_id", "date", "start_time"], mutates=True)
def reschedule_event(db: sqlite3.Connection, event_id: int, date: str, start_time: str) -> dict[str, Any]:
    _one(db, "SELECT id FROM events WHERE id = ?", (event_id,), f"event {event_id}")
    db.execute("UPDATE events SET date = ?, start_time = ? WHERE id = ?", (date, start_time, event_id))
    return _event(db, _one(db, "SELECT * FROM events WHERE id = ?", (event_id,), "event"))


@tool("add_attendee", "calendar", "Add a person to an event.", {"event_id": _ID, "name": _NAME}, ["event_id", "name"],
      mutates=True)
def add_attendee(db: sqlite3.Connection, event_id: int, name: str) -> dict[str, Any]:
    row = _one(db, "SELECT * FROM events WHERE id = ?", (event_id,), f"event {event_id}")
    if db.execute("SELECT 1 FROM attendees WHERE event_id = ? AND name = ?", (event_id, name)).fetchone():
        raise ToolFailure(f"{name} already attends event {event_id}")
    db.execute("INSERT INTO attendees (event_id, name) VALUES (?, ?)", (event_id, name))
    return _event(db, row)


@tool("delete_event", "calendar", "Delete an event.", {"event_id": _ID}, ["event_id"], mutates=True)
def delete_event(db: sqlite3.Connection, event_id: int) -> dict[str, Any]:
    _one(db, "SELECT id FROM events WHERE id = ?", (event_id,), f"event {event_id}")
    db.execute("DELETE FROM attendees WHERE event_id = ?", (event_id,))
    db.execute("DELETE FROM events WHERE id = ?", (event_id,))
    return {"deleted": event_id}


# -- files -----------------------------------------------------------------------------------------------------------
@tool("list_files", "files", "List the files in a folder (e.g. /docs).", {"folder": _PATH}, ["folder"])
def list_files(db: sqlite3.Connection, folder: str) -> list[str]:
    prefix = folder.rstrip("/") + "/"
    rows = db.execute("SELECT path FROM files WHERE substr(path, 1, ?) = ? ORDER BY path", (len(prefix), prefix))
    return [r[0] for r in rows if "/" not in r[0][len(prefix):]]


@tool("read_file", "files", "Read a file's text.", {"path": _PATH}, ["path"])
def read_file(db: sqlite3.Connection, path: str) -> dict[str, Any]:
    row = _one(db, "SELECT content FROM files WHERE path = ?", (path,), f"file {path}")
    return {"path": path, "content": row["content"]}


@tool("write_file", "files", "Create or overwrite a file.",
      {"path": _PATH, "content": {"type": "string", "maxLength": 4000}}, ["path", "content"], mutates=True)
def write_file(db: sqlite3.Connection, path: str, content: str) -> dict[str, Any]:
    db.execute("INSERT INTO files (path, content) VALUES (?, ?) ON CONFLICT(path) DO UPDATE SET content = excluded.content",
               (path, content))
    return {"path": path, "bytes": len(content.encode())}


@tool("move_file", "files", "Move (rename) a file.", {"source": _PATH, "destination": _PATH},
      ["source", "destination"], mutates=True)
def move_file(db: sqlite3.Connection, source: str, destination: str) -> dict[str, Any]:
    _one(db, "SELECT path FROM files WHERE path = ?", (source,), f"file {source}")
    if db.execute("SELECT 1 FROM files WHERE path = ?", (destination,)).fetchone():
        raise ToolFailure(f"{destination} already exists")
    db.execute("UPDATE files SET path = ? WHERE path = ?", (destination, source))
    return {"moved": source, "to": destination}


@tool("delete_file", "files", "Delete a file.", {"path": _PATH}, ["path"], mutates=True)
def delete_file(db: sqlite3.Connection, path: str) -> dict[str, Any]:
    _one(db, "SELECT path FROM files WHERE path = ?", (path,), f"file {path}")
    db.execute("DELETE FROM files WHERE path = ?", (path,))
    return {"deleted": path}
