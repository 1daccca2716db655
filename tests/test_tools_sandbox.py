"""The SQLite sandbox: seeded worlds, schema validation, rollback on failure, injection strings stay data."""

import json

import pytest

from rlvr_envs.tools.sandbox import Sandbox
from rlvr_envs.tools.services import TOOLS
from rlvr_envs.verifiers.calls import ToolCall


@pytest.fixture
def sb():
    box = Sandbox.generate(7)
    yield box
    box.close()


def test_same_seed_same_world_and_different_seed_different_world(sb):
    other = Sandbox.generate(7)
    assert other.digest() == sb.digest()
    assert Sandbox.generate(8).digest() != sb.digest()
    assert sb.integrity_problems() == []


def test_clone_is_independent(sb):
    copy = sb.clone()
    before = sb.digest()
    assert copy.call(ToolCall("restock_product", {"product_id": 501, "quantity": 3})).ok
    assert sb.digest() == before != copy.digest()


@pytest.mark.parametrize("call, status", [
    (ToolCall("no_such_tool", {}), "invalid"),
    (ToolCall("get_customer", {"customer_id": "101"}), "invalid"),  # string for integer
    (ToolCall("get_customer", {"customer_id": 101.0}), "invalid"),  # float for integer
    (ToolCall("get_customer", {"customer_id": True}), "invalid"),  # bool for integer
    (ToolCall("get_customer", {}), "invalid"),  # missing required
    (ToolCall("get_customer", {"customer_id": 101, "x": 1}), "invalid"),  # unknown argument
    (ToolCall("get_customer", {"customer_id": 10**30}), "invalid"),  # beyond SQLite's integers
    (ToolCall("write_file", {"path": "/docs/a.txt", "content": "x" * 5000}), "invalid"),  # oversized
    (ToolCall("write_file", {"path": "../../etc/passwd", "content": "x"}), "invalid"),
    (ToolCall("get_customer", {"customer_id": 999_999}), "failed"),  # well-formed, no such row
    (ToolCall("place_order", {"customer_id": 101, "product_id": 501, "quantity": 100}), "failed"),
    (ToolCall("cancel_order", {"order_id": 999}), "failed"),
])
def test_bad_calls_give_structured_errors_and_leave_the_state_intact(sb, call, status):
    before = sb.digest()
    result = sb.call(call)
    assert result.status == status
    assert "error" in json.loads(result.content)
    assert sb.digest() == before and sb.integrity_problems() == []


def test_tools_outside_the_episode_are_unknown(sb):
    assert sb.call(ToolCall("list_files", {"folder": "/docs"}), allowed={"get_customer"}).status == "invalid"


@pytest.mark.parametrize("evil", ["'; DROP TABLE customers; --", "\" OR 1=1 --", "Robert'); DELETE FROM orders;--",
                                  "%' UNION SELECT * FROM files --", "\x00\n\t\\"])
def test_sql_injection_strings_are_data(sb, evil):
    before = sb.digest()
    assert json.loads(sb.call(ToolCall("find_customers", {"name": evil})).content) == []
    assert json.loads(sb.call(ToolCall("search_products", {"query": evil})).content) == []
    assert sb.digest() == before
    # A write tool stores the string verbatim; nothing else changes and the schema survives.
    assert sb.call(ToolCall("create_event", {"title": evil, "date": "2025-03-04", "start_time": "10:00",
                                             "duration_minutes": 30, "attendees": [evil]})).ok
    assert sb.integrity_problems() == []
    assert any(r[1] == evil for r in sb.rows("events"))
    assert len(sb.rows("customers")) == 12 and len(sb.rows("orders")) == 18


def test_orders_move_stock_both_ways(sb):
    stock = lambda: json.loads(sb.call(ToolCall("get_product", {"product_id": 501})).content)["stock"]  # noqa: E731
    start = stock()
    if start < 1:
        sb.call(ToolCall("restock_product", {"product_id": 501, "quantity": 5}))
        start = stock()
    order = json.loads(sb.call(ToolCall("place_order", {"customer_id": 101, "product_id": 501, "quantity": 1})).content)
    assert order["status"] == "pending" and stock() == start - 1
    assert sb.call(ToolCall("cancel_order", {"order_id": order["order_id"]})).ok and stock() == start
    assert sb.call(ToolCall("cancel_order", {"order_id": order["order_id"]})).status == "failed"


def test_every_tool_schema_is_well_formed():
    for name, t in TOOLS.items():
        schema = t.schema()["function"]
        assert schema["name"] == name and schema["parameters"]["type"] == "object"
        assert set(schema["parameters"]["required"]) <= set(schema["parameters"]["properties"])
