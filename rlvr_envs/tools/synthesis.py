"""State-grounded query synthesis: every query is built from entities that exist in the episode's sandbox.

A template samples real rows (a customer who really has a pending order for a product, a product with enough stock,
an event whose title is unique), writes the request in words, and records the minimal ground-truth plan with concrete
arguments (ids that a later step needs are predicted from the state). ``synthesize`` then runs the plan on a clone of
the sandbox: every call must succeed and predicted ids must match what the tools return, or the draft is discarded.
The clone's final digest and the expected answer are the ground truth the env scores against.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rlvr_envs.tools.sandbox import DATES, TIMES, Sandbox
from rlvr_envs.verifiers.calls import ToolCall


@dataclass(frozen=True)
class Draft:
    query: str
    plan: tuple[ToolCall, ...]
    answer: str | None = None  # None: a state-changing request with nothing to report
    answer_kind: str = "none"  # "number", "text" or "none"
    # (step, key, value): the JSON result of plan step ``step`` (or an item of it, for lists) has ``key == value``.
    # This is how a template's predictions about the state (a new order's id, an entity's field) are checked.
    checks: tuple[tuple[int, str, object], ...] = ()


@dataclass(frozen=True)
class Episode:
    template: str
    query: str
    plan: tuple[ToolCall, ...]
    answer: str | None
    answer_kind: str
    services: tuple[str, ...]
    gold_digest: str
    gold_results: tuple[str, ...]


Template = Callable[[Sandbox, np.random.Generator], "Draft | None"]
TEMPLATES: dict[str, tuple[int, tuple[str, ...], Template]] = {}


def template(name: str, steps: int, services: Sequence[str]) -> Callable[[Template], Template]:
    def register(fn: Template) -> Template:
        TEMPLATES[name] = (steps, tuple(services), fn)
        return fn
    return register


def _choice(rng: np.random.Generator, rows: Sequence):
    return rows[int(rng.integers(len(rows)))] if rows else None


def _money(cents: int) -> str:
    return f"{cents / 100:.2f}"


def _c(tool_name: str, /, **arguments) -> ToolCall:
    return ToolCall(tool_name, arguments)


# -- 1 step ----------------------------------------------------------------------------------------------------------
@template("customer_email", 1, ["shop"])
def customer_email(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    c = _choice(rng, sb.query("SELECT * FROM customers ORDER BY id"))
    ask = _choice(rng, ("What is the email address of {n}?", "Look up {n}'s email address for me."))
    return Draft(ask.format(n=c["name"]), (_c("find_customers", name=c["name"]),), c["email"], "text",
                 ((0, "email", c["email"]),))


@template("product_stock", 1, ["shop"])
def product_stock(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    p = _choice(rng, sb.query("SELECT * FROM products ORDER BY id"))
    return Draft(f"How many units of the {p['name']} do we have in stock?", (_c("search_products", query=p["name"]),),
                 str(p["stock"]), "number", ((0, "stock", p["stock"]),))


@template("restock", 1, ["shop"])
def restock(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    p = _choice(rng, sb.query("SELECT * FROM products ORDER BY id"))
    n = int(rng.integers(5, 50))
    return Draft(f"We just received {n} more units of product #{p['id']} ({p['name']}). Add them to its stock.",
                 (_c("restock_product", product_id=p["id"], quantity=n),))


@template("schedule_event", 1, ["calendar"])
def schedule_event(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    title = _choice(rng, ("Supplier visit", "1:1 with Priya", "Inventory check", "Launch review", "Interview loop"))
    date, time = _choice(rng, DATES), _choice(rng, TIMES)
    duration = int(_choice(rng, (30, 45, 60)))
    people = sorted({_choice(rng, ("Sam", "Alex", "Jordan", "Robin")), _choice(rng, ("Casey", "Morgan", "Jamie"))})
    return Draft(f"Schedule a {duration}-minute event called '{title}' on {date} at {time} with {' and '.join(people)}.",
                 (_c("create_event", title=title, date=date, start_time=time, duration_minutes=duration,
                     attendees=people),))


@template("count_files", 1, ["files"])
def count_files(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    folder = _choice(rng, ("/docs", "/notes", "/reports"))
    n = len(sb.query("SELECT path FROM files WHERE path LIKE ?", (folder + "/%",)))
    return Draft(f"How many files are in the {folder} folder?", (_c("list_files", folder=folder),), str(n), "number")


# -- 2 steps ---------------------------------------------------------------------------------------------------------
@template("update_email", 2, ["shop"])
def update_email(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    c = _choice(rng, sb.query("SELECT * FROM customers ORDER BY id"))
    first, last = c["name"].lower().split()
    email = f"{first[0]}{last}@{_choice(rng, ('mail.com', 'inbox.org', 'post.net'))}"
    return Draft(f"{c['name']} has a new email address, {email}. Please update their customer record.",
                 (_c("find_customers", name=c["name"]), _c("update_customer_email", customer_id=c["id"], email=email)))


@template("reschedule", 2, ["calendar"])
def reschedule(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    e = _choice(rng, sb.query("SELECT * FROM events WHERE title IN (SELECT title FROM events GROUP BY title "
                              "HAVING COUNT(*) = 1) ORDER BY id"))
    date, time = _choice(rng, DATES), _choice(rng, TIMES)
    if e is None or (date, time) == (e["date"], e["start_time"]):
        return None
    return Draft(f"Move the '{e['title']}' event to {date} at {time}.",
                 (_c("find_events", title=e["title"]), _c("reschedule_event", event_id=e["id"], date=date, start_time=time)))


@template("copy_file", 2, ["files"])
def copy_file(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    f = _choice(rng, sb.query("SELECT * FROM files ORDER BY path"))
    dst = f"/archive/{f['path'].rsplit('/', 1)[1].replace('.txt', '')}_copy.txt"
    if sb.query("SELECT 1 FROM files WHERE path = ?", (dst,)):
        return None
    return Draft(f"Make a copy of {f['path']} at {dst} (same content).",
                 (_c("read_file", path=f["path"]), _c("write_file", path=dst, content=f["content"])))


@template("pending_count", 2, ["shop"])
def pending_count(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    c = _choice(rng, sb.query("SELECT * FROM customers ORDER BY id"))
    n = len(sb.query("SELECT id FROM orders WHERE customer_id = ? AND status = 'pending'", (c["id"],)))
    return Draft(f"How many pending orders does {c['name']} have?",
                 (_c("find_customers", name=c["name"]), _c("list_orders", customer_id=c["id"], status="pending")),
                 str(n), "number")


@template("invite", 2, ["calendar"])
def invite(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    e = _choice(rng, sb.query("SELECT * FROM events WHERE title IN (SELECT title FROM events GROUP BY title "
                              "HAVING COUNT(*) = 1) ORDER BY id"))
    person = _choice(rng, ("Sam", "Alex", "Jordan", "Robin", "Casey", "Morgan", "Jamie", "Taylor"))
    if e is None or sb.query("SELECT 1 FROM attendees WHERE event_id = ? AND name = ?", (e["id"], person)):
        return None
    return Draft(f"Add {person} to the attendees of the '{e['title']}' event.",
                 (_c("find_events", title=e["title"]), _c("add_attendee", event_id=e["id"], name=person)))


# -- 3 steps ---------------------------------------------------------------------------------------------------------
def _orderable(sb: Sandbox, rng: np.random.Generator):
    c = _choice(rng, sb.query("SELECT * FROM customers ORDER BY id"))
    p = _choice(rng, sb.query("SELECT * FROM products WHERE stock >= 2 ORDER BY id"))
    if p is None:
        return None
    q = int(rng.integers(1, min(p["stock"], 5) + 1))
    oid = sb.query("SELECT COALESCE(MAX(id), 1000) + 1 FROM orders")[0][0]
    plan = (_c("find_customers", name=c["name"]), _c("search_products", query=p["name"]),
            _c("place_order", customer_id=c["id"], product_id=p["id"], quantity=q))
    return c, p, q, oid, plan


@template("place_order", 3, ["shop"])
def place_order(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    got = _orderable(sb, rng)
    if got is None:
        return None
    c, p, q, _, plan = got
    return Draft(f"Place an order of {q} x {p['name']} for {c['name']}.", plan)


@template("order_total", 3, ["shop"])
def order_total(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    got = _orderable(sb, rng)
    if got is None:
        return None
    c, p, q, _, plan = got
    return Draft(f"Order {q} units of the {p['name']} for {c['name']}, and tell me the order total in dollars.", plan,
                 _money(q * p["price_cents"]), "number", ((2, "total", round(q * p["price_cents"] / 100, 2)),))


def _pending_pair(sb: Sandbox, rng: np.random.Generator):
    # A (customer, product) pair with exactly one pending order, so "their pending order for X" is unambiguous.
    rows = sb.query("SELECT o.id, o.customer_id, c.name AS customer, p.name AS product FROM orders o "
                    "JOIN customers c ON c.id = o.customer_id JOIN products p ON p.id = o.product_id "
                    "WHERE o.status = 'pending' GROUP BY o.customer_id, o.product_id HAVING COUNT(*) = 1 ORDER BY o.id")
    return _choice(rng, rows)


@template("cancel_order", 3, ["shop"])
def cancel_order(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    o = _pending_pair(sb, rng)
    if o is None:
        return None
    return Draft(f"Cancel {o['customer']}'s pending order for the {o['product']}.",
                 (_c("find_customers", name=o["customer"]), _c("list_orders", customer_id=o["customer_id"], status="pending"),
                  _c("cancel_order", order_id=o["id"])), checks=((1, "order_id", o["id"]),))


# -- 4 steps ---------------------------------------------------------------------------------------------------------
@template("order_and_delivery", 4, ["shop", "calendar"])
def order_and_delivery(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    got = _orderable(sb, rng)
    if got is None:
        return None
    c, p, q, oid, plan = got
    date, time = _choice(rng, DATES), _choice(rng, TIMES)
    return Draft(f"Place an order of {q} x {p['name']} for {c['name']}, then schedule a 30-minute event titled "
                 f"'Delivery for order <order id>' (with the new order's id) on {date} at {time}, with {c['name']} as "
                 "the only attendee.",
                 (*plan, _c("create_event", title=f"Delivery for order {oid}", date=date, start_time=time,
                            duration_minutes=30, attendees=[c["name"]])),
                 checks=((2, "order_id", oid),))


@template("cancel_and_note", 4, ["shop", "files"])
def cancel_and_note(sb: Sandbox, rng: np.random.Generator) -> Draft | None:
    o = _pending_pair(sb, rng)
    if o is None:
        return None
    path = f"/notes/refund_{o['customer'].split()[0].lower()}.txt"
    if sb.query("SELECT 1 FROM files WHERE path = ?", (path,)):
        return None
    return Draft(f"Cancel {o['customer']}'s pending order for the {o['product']}, then write a file {path} whose "
                 "content is exactly 'Refund order <order id>' (with that order's id).",
                 (_c("find_customers", name=o["customer"]), _c("list_orders", customer_id=o["customer_id"], status="pending"),
                  _c("cancel_order", order_id=o["id"]), _c("write_file", path=path, content=f"Refund order {o['id']}")),
                 checks=((1, "order_id", o["id"]),))


# -- driver ----------------------------------------------------------------------------------------------------------
def eligible_templates(min_steps: int, max_steps: int, services: Sequence[str]) -> list[str]:
    names = [n for n, (steps, svc, _) in TEMPLATES.items()
             if min_steps <= steps <= max_steps and set(svc) <= set(services)]
    if not names:
        raise ValueError(f"no query template has {min_steps}-{max_steps} steps over services {sorted(services)}")
    return names


class SynthesisError(RuntimeError):
    pass


def _holds(result: object, key: str, value: object) -> bool:
    items = result if isinstance(result, list) else [result]
    return any(isinstance(item, dict) and item.get(key) == value for item in items)


def synthesize(sb: Sandbox, rng: np.random.Generator, names: Sequence[str], attempts: int = 50) -> Episode:
    """A query grounded in ``sb`` whose plan was checked by running it on a clone."""
    for _ in range(attempts):
        name = names[int(rng.integers(len(names)))]
        steps, services, fn = TEMPLATES[name]
        draft = fn(sb, rng)
        if draft is None:
            continue
        if len(draft.plan) != steps:
            raise SynthesisError(f"template {name} produced a {len(draft.plan)}-step plan (declared {steps})")
        gold = sb.clone()
        try:
            results = [gold.call(call) for call in draft.plan]
            if not all(r.ok for r in results):
                bad = next(r for r in results if not r.ok)
                raise SynthesisError(f"template {name}: ground-truth plan failed: {bad.content}")
            for step, key, value in draft.checks:
                if not _holds(json.loads(results[step].content), key, value):
                    raise SynthesisError(f"template {name}: step {step} result lacks {key}={value!r}")
            return Episode(name, draft.query, draft.plan, draft.answer, draft.answer_kind, services, gold.digest(),
                           tuple(r.content for r in results))
        finally:
            gold.close()
    raise SynthesisError(f"no applicable template among {list(names)} after {attempts} attempts")
