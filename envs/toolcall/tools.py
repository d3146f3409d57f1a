"""The tools of ToolCall-v0: their JSON Schemas, the errors a call can raise (each becomes a tool-error
observation through :class:`~agentgym.ToolSet`) and :class:`RetailStore`, the per-episode SQLite
backend whose methods are the tools."""

from __future__ import annotations

import copy
import functools
import re
import sqlite3
from typing import Any, Callable, Sequence

from agentgym import Tool

from .store import CATEGORIES, StoreData, _eur

#: Text of the injected transient failure; an agent (and the oracle) recognise it to retry.
TRANSIENT_MARKER = "temporarily unavailable"


class StoreError(Exception):
    """A business-level failure of a tool (becomes a tool-error observation via ToolSet)."""


class NotFound(StoreError):
    pass


class InsufficientStock(StoreError):
    pass


class InvalidRequest(StoreError):
    pass


class ServiceUnavailable(StoreError):
    """The injected transient failure: the call had no effect and may simply be retried."""


_SCHEMA = """
CREATE TABLE products (product_id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, category TEXT NOT NULL,
                       price_cents INTEGER NOT NULL CHECK (price_cents > 0));
CREATE TABLE locations (name TEXT PRIMARY KEY);
CREATE TABLE inventory (product_id INTEGER NOT NULL REFERENCES products, location TEXT NOT NULL REFERENCES locations,
                        quantity INTEGER NOT NULL CHECK (quantity >= 0), PRIMARY KEY (product_id, location));
CREATE TABLE customers (customer_id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL UNIQUE,
                        city TEXT NOT NULL);
CREATE TABLE orders (order_id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers,
                     product_id INTEGER NOT NULL REFERENCES products, quantity INTEGER NOT NULL CHECK (quantity > 0),
                     location TEXT NOT NULL REFERENCES locations, status TEXT NOT NULL, total_cents INTEGER NOT NULL);
"""

_ID = {"type": "integer", "minimum": 1, "maximum": 10**9}
_NULLABLE_STR = {"type": ["string", "null"], "maxLength": 100}
TOOL_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "search_product": (
        "Search the catalogue by words of a product's name (e.g. \"travel kettle\"), optionally within one "
        "category. Returns up to 5 matches with product_id, name, category and price in EUR.",
        {"properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200,
                                  "description": "words of the product name"},
                        "category": {"enum": [*CATEGORIES, None], "description": "only this category"}},
         "required": ["query"]}),
    "check_inventory": (
        "Units in stock of a product at each store, or at one store if location is given.",
        {"properties": {"product_id": _ID, "location": {**_NULLABLE_STR, "description": "store city"}},
         "required": ["product_id"]}),
    "find_customer": (
        "Find customers by email address or (part of) their name. Returns customer_id, name, email, city.",
        {"properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200,
                                  "description": "email or name"}},
         "required": ["query"]}),
    "get_customer": (
        "A customer's details and their orders (order_id, product, quantity, status).",
        {"properties": {"customer_id": _ID}, "required": ["customer_id"]}),
    "get_order": (
        "Details of one order: customer, product, quantity, store, status and total in EUR.",
        {"properties": {"order_id": _ID}, "required": ["order_id"]}),
    "create_order": (
        "Place an order. Stock is taken from the given store (location), else from the store with the most "
        "units that can cover the whole quantity. Fails without effect if there is not enough stock.",
        {"properties": {"product_id": _ID, "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
                        "customer_id": _ID, "location": {**_NULLABLE_STR, "description": "store city"}},
         "required": ["product_id", "quantity", "customer_id"]}),
    "cancel_order": (
        "Cancel an order that has not shipped yet (status placed); its units go back to stock.",
        {"properties": {"order_id": _ID}, "required": ["order_id"]}),
}
TOOL_NAMES = tuple(TOOL_SCHEMAS)


@functools.lru_cache(maxsize=1)
def _tool_templates() -> tuple[Tool, ...]:
    """The tools without a backend, built once per process: ``Tool`` meta-validates its schema
    (about 10 ms per tool), and the rollout engine creates one env per episode slot."""
    def unbound(**_: Any) -> Any:
        raise InvalidRequest("this tool is not bound to a store")
    return tuple(Tool(name, description, {"type": "object", **schema, "additionalProperties": False}, unbound)
                 for name, (description, schema) in TOOL_SCHEMAS.items())


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9@.\-]+", text.lower())


def _word_matches(token: str, word: str) -> bool:
    """``kettle`` matches ``Kettle``; ``kettles`` and ``kett`` do too (plural / prefix of 3+ letters)."""
    return word == token or token == word + "s" or token == word + "es" or (len(token) >= 3 and word.startswith(token))


class RetailStore:
    """The per-episode backend: an in-memory SQLite database and the tool functions over it.

    ``check_same_thread=False``: the episode is reset in one thread and may be stepped in a rollout
    engine's worker thread; steps of one env never overlap, so sharing the connection is safe.
    """

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.data: StoreData | None = None
        self.fail_pending: str | None = None   # tool whose next call fails transiently
        self.transient_fired = False           # set when that failure was just raised

    # ---------------------------------------------------------------- lifecycle
    def load(self, data: StoreData, fail_first: str | None = None) -> None:
        """A fresh database holding ``data``; the first call to ``fail_first`` will fail transiently."""
        self.close()
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        conn.executescript(_SCHEMA)
        conn.executemany("INSERT INTO products VALUES (?, ?, ?, ?)", data.products)
        conn.executemany("INSERT INTO locations VALUES (?)", [(loc,) for loc in data.locations])
        conn.executemany("INSERT INTO inventory VALUES (?, ?, ?)", data.inventory)
        conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?)", data.customers)
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?)", data.orders)
        conn.commit()
        self.conn, self.data = conn, data
        self.fail_pending, self.transient_fired = fail_first, False

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def dump(self) -> list[str]:
        """The whole database as SQL statements (for equality checks in tests and debugging)."""
        assert self.conn is not None
        return list(self.conn.iterdump())

    def tools(self) -> list[Tool]:
        """The tools, bound to this store, with hand-written JSON Schemas (validated by ToolSet)."""
        out = []
        for template in _tool_templates():
            bound = copy.copy(template)  # shares the checked schema and its validator
            bound.fn = self._guarded(template.name, getattr(self, template.name))
            out.append(bound)
        return out

    def _guarded(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(**arguments: Any) -> Any:
            if self.conn is None:
                raise InvalidRequest("the store is not open; reset the environment")
            if self.fail_pending == name:
                self.fail_pending, self.transient_fired = None, True
                raise ServiceUnavailable(f"the {name} service is {TRANSIENT_MARKER} (HTTP 503); "
                                         "the call had no effect, retry it")
            return fn(**arguments)
        return call

    # ---------------------------------------------------------------- helpers
    def _q(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        assert self.conn is not None
        return self.conn.execute(sql, tuple(params)).fetchall()

    def _location(self, location: str) -> str:
        for (name,) in self._q("SELECT name FROM locations ORDER BY name"):
            if name.lower() == location.strip().lower():
                return name
        stores = ", ".join(n for (n,) in self._q("SELECT name FROM locations ORDER BY name"))
        raise NotFound(f"no store named {location!r}; stores: {stores}")

    def _product(self, product_id: int) -> tuple[int, str, str, int]:
        rows = self._q("SELECT product_id, name, category, price_cents FROM products WHERE product_id = ?", [int(product_id)])
        if not rows:
            raise NotFound(f"no product with product_id {int(product_id)}")
        return rows[0]

    def search_ids(self, query: str, category: str | None = None) -> list[int]:
        """Ids of products whose name (and category) contain every word of ``query``, by name."""
        tokens = _words(query)
        if not tokens:
            raise InvalidRequest("the query has no words to search for")
        rows = self._q("SELECT product_id, name, category FROM products ORDER BY name")
        hits = []
        for pid, name, cat in rows:
            if category is not None and cat != category:
                continue
            words = _words(name) + [cat]
            if all(any(_word_matches(t, w) for w in words) for t in tokens):
                hits.append(pid)
        return hits

    def customer_ids(self, query: str) -> list[int]:
        """Ids of customers whose email equals ``query`` or whose name contains it (case-insensitive)."""
        q = " ".join(query.lower().split())
        if not q:
            raise InvalidRequest("the query is empty")
        rows = self._q("SELECT customer_id, name, email FROM customers ORDER BY customer_id")
        return [cid for cid, name, email in rows if q == email.lower() or q in name.lower() or (len(q) >= 3 and q in email.lower())]

    # ---------------------------------------------------------------- tools
    def search_product(self, query: str, category: str | None = None) -> dict[str, Any]:
        ids = self.search_ids(query, category)
        results = []
        for pid in ids[:5]:
            _, name, cat, cents = self._product(pid)
            results.append({"product_id": pid, "name": name, "category": cat, "price_eur": _eur(cents)})
        return {"results": results, "total_matches": len(ids)}

    def check_inventory(self, product_id: int, location: str | None = None) -> dict[str, Any]:
        pid, name, _, _ = self._product(product_id)
        if location is not None:
            loc = self._location(location)
            (qty,), = self._q("SELECT quantity FROM inventory WHERE product_id = ? AND location = ?", [pid, loc])
            return {"product_id": pid, "name": name, "location": loc, "in_stock": qty}
        rows = self._q("SELECT location, quantity FROM inventory WHERE product_id = ? ORDER BY location", [pid])
        return {"product_id": pid, "name": name, "stock_by_store": {loc: q for loc, q in rows},
                "total": sum(q for _, q in rows)}

    def find_customer(self, query: str) -> dict[str, Any]:
        ids = self.customer_ids(query)
        rows = [self._q("SELECT customer_id, name, email, city FROM customers WHERE customer_id = ?", [c])[0] for c in ids[:5]]
        return {"results": [{"customer_id": c, "name": n, "email": e, "city": city} for c, n, e, city in rows]}

    def get_customer(self, customer_id: int) -> dict[str, Any]:
        rows = self._q("SELECT customer_id, name, email, city FROM customers WHERE customer_id = ?", [int(customer_id)])
        if not rows:
            raise NotFound(f"no customer with customer_id {int(customer_id)}")
        cid, name, email, city = rows[0]
        orders = self._q("SELECT o.order_id, p.name, o.quantity, o.status FROM orders o JOIN products p "
                         "ON p.product_id = o.product_id WHERE o.customer_id = ? ORDER BY o.order_id", [cid])
        return {"customer_id": cid, "name": name, "email": email, "city": city,
                "orders": [{"order_id": o, "product": p, "quantity": q, "status": s} for o, p, q, s in orders]}

    def get_order(self, order_id: int) -> dict[str, Any]:
        rows = self._q("SELECT o.order_id, o.customer_id, o.product_id, p.name, o.quantity, o.location, o.status, "
                       "o.total_cents FROM orders o JOIN products p ON p.product_id = o.product_id "
                       "WHERE o.order_id = ?", [int(order_id)])
        if not rows:
            raise NotFound(f"no order with order_id {int(order_id)}")
        oid, cid, pid, pname, q, loc, status, total = rows[0]
        return {"order_id": oid, "customer_id": cid, "product_id": pid, "product": pname, "quantity": q,
                "location": loc, "status": status, "total_eur": _eur(total)}

    def create_order(self, product_id: int, quantity: int, customer_id: int, location: str | None = None) -> dict[str, Any]:
        pid, pname, _, cents = self._product(product_id)
        quantity = int(quantity)
        if not self._q("SELECT 1 FROM customers WHERE customer_id = ?", [int(customer_id)]):
            raise NotFound(f"no customer with customer_id {int(customer_id)}")
        stock = dict(self._q("SELECT location, quantity FROM inventory WHERE product_id = ?", [pid]))
        if location is not None:
            loc = self._location(location)
            if stock[loc] < quantity:
                raise InsufficientStock(f"only {stock[loc]} unit(s) of product {pid} at {loc}; requested {quantity}")
        else:
            best = max(sorted(stock), key=lambda s: stock[s])  # most units; ties: first by name
            if stock[best] < quantity:
                raise InsufficientStock(f"no store has {quantity} unit(s) of product {pid}; the most at one store "
                                        f"is {stock[best]} ({best})")
            loc = best
        assert self.conn is not None
        with self.conn:  # one transaction: both rows change or neither
            (next_id,), = self._q("SELECT MAX(order_id) + 1 FROM orders")
            self.conn.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?, 'placed', ?)",
                              (next_id, int(customer_id), pid, quantity, loc, quantity * cents))
            self.conn.execute("UPDATE inventory SET quantity = quantity - ? WHERE product_id = ? AND location = ?",
                              (quantity, pid, loc))
        return {"order_id": next_id, "status": "placed", "customer_id": int(customer_id), "product_id": pid,
                "product": pname, "quantity": quantity, "location": loc, "total_eur": _eur(quantity * cents)}

    def cancel_order(self, order_id: int) -> dict[str, Any]:
        rows = self._q("SELECT product_id, quantity, location, status FROM orders WHERE order_id = ?", [int(order_id)])
        if not rows:
            raise NotFound(f"no order with order_id {int(order_id)}")
        pid, q, loc, status = rows[0]
        if status != "placed":
            raise InvalidRequest(f"order {int(order_id)} is {status} and can no longer be cancelled")
        assert self.conn is not None
        with self.conn:
            self.conn.execute("UPDATE orders SET status = 'cancelled' WHERE order_id = ?", (int(order_id),))
            self.conn.execute("UPDATE inventory SET quantity = quantity + ? WHERE product_id = ? AND location = ?",
                              (q, pid, loc))
        return {"order_id": int(order_id), "status": "cancelled"}

    # ---------------------------------------------------------------- final-state checks
    def effects(self) -> dict[str, Any]:
        """What changed since :meth:`load`: new orders, status changes of old orders, current stock."""
        assert self.data is not None
        before = {o[0]: o for o in self.data.orders}
        rows = self._q("SELECT order_id, customer_id, product_id, quantity, location, status FROM orders ORDER BY order_id")
        now = {r[0] for r in rows}
        new = [{"order_id": r[0], "customer_id": r[1], "product_id": r[2], "quantity": r[3], "location": r[4],
                "status": r[5]} for r in rows if r[0] not in before]
        changed = {r[0]: r[5] for r in rows if r[0] in before and before[r[0]][5] != r[5]}
        changed.update({oid: "deleted" for oid in before if oid not in now})
        stock = {(pid, loc): q for pid, loc, q in self._q("SELECT product_id, location, quantity FROM inventory")}
        return {"new_orders": new, "status_changes": changed, "stock": stock}
