"""``agentgym/ToolCall-v0``: a retail-support agent calling tools against a per-episode SQLite store.

Each episode builds a small shop in an in-memory SQLite database from the task's seed (products with
categories and prices, stock per store, customers, orders) and puts a user request in front of the
agent. The agent calls tools in the Hermes/Qwen format, one per turn,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and ends the episode with
``<answer>...</answer>`` (its reply to the user). Success is checked on the **final database
state** (the right order exists, the right order is cancelled, nothing else changed) and, where the
request asks for a fact, on the answer text.

Why these pieces:

* Task families cover the decisions a tool-using agent must learn: answering without tools when the
  system prompt already holds the fact (over-calling costs), single lookups, multi-tool chains that
  change the database, out-of-stock situations that must be noticed and handled, and injected
  transient failures (the first call to one tool fails with a retryable error) that reward a retry.
  Every task carries its target tool set, the gold plan and the optimal number of turns, so rewards
  and metrics are computed, not judged.
* Reward terms follow the seed design (weights configurable): terminal ``task_completion`` 0.4,
  ``tool_accuracy`` 0.25 (F1 of called vs target tool names), ``efficiency`` 0.15 (optimal turns /
  turns, paid only on success so that a quick wrong answer earns nothing), ``timing`` 0.10 (share of
  well-timed decisions: a tool call while a needed tool is still outstanding, an answer only once all
  are done, never a call and an answer in one message), ``format`` 0.10 (share of well-formed turns);
  step-wise penalties ``wrong_tool`` 0.3, ``redundant_call`` 0.2 (a call identical to an earlier
  successful one), ``format_error`` 0.1 (unparseable action or schema violation), ``timeout`` 0.5
  (turn limit). A perfect episode returns exactly 1.0.
* Shapers are pure functions of the :class:`~agentgym.rewards.StepEvent`: the env writes what they
  need into each step's ``info`` (tool, whether it was a target tool, redundancy, timing, and at the
  answer the database and answer checks), so re-weighting or adding terms needs no env access.

Written only against the public ``agentgym`` API, as a user's own env would be.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import sqlite3
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from agentgym import AgentEnv, Reward, Tool, ToolSet, Transition, shaper
from agentgym.parsing import first_tag, parse_tool_calls
from agentgym.rewards import StepEvent, TurnLimitPenalty

__all__ = [
    "ToolCallEnv", "RetailStore", "StoreData", "generate_store", "FAMILIES", "TRANSIENT_MARKER",
    "tool_f1", "answer_numbers",
]

# --------------------------------------------------------------------------- store content
CATALOG: dict[str, tuple[str, ...]] = {
    "electronics": ("Headphones", "Speaker", "Charger", "Keyboard", "Mouse", "Monitor", "Webcam"),
    "kitchen": ("Kettle", "Blender", "Toaster", "Skillet", "Teapot", "Grinder"),
    "outdoor": ("Tent", "Backpack", "Lantern", "Hammock", "Cooler", "Compass"),
    "office": ("Stapler", "Notebook", "Planner", "Organizer", "Whiteboard", "Shredder"),
    "toys": ("Puzzle", "Kite", "Robot", "Train", "Drone"),
}
CATEGORIES = tuple(CATALOG)
_PRICE_RANGE_EUR = {"electronics": (15, 250), "kitchen": (10, 120), "outdoor": (12, 180),
                    "office": (4, 90), "toys": (6, 80)}
ADJECTIVES = ("Compact", "Classic", "Deluxe", "Eco", "Smart", "Mini", "Rugged", "Silent", "Travel",
              "Urban", "Vintage", "Nordic")
CITIES = ("Berlin", "Lyon", "Porto", "Oslo", "Austin", "Osaka", "Dublin", "Turin", "Ghent", "Krakow")
FIRST_NAMES = ("Ada", "Bruno", "Chiara", "Dmitri", "Elif", "Farah", "Goran", "Hana", "Ivo", "Jonas", "Kaia",
               "Luca", "Mira", "Nils", "Olga", "Pavel", "Rosa", "Sami", "Tilde", "Uma", "Viktor", "Wen")
LAST_NAMES = ("Almeida", "Berger", "Costa", "Dahl", "Eriksen", "Fischer", "Garcia", "Horvat", "Ivanova",
              "Jensen", "Kowalski", "Laurent", "Moreau", "Novak", "Okafor", "Petrov", "Quinn", "Rossi")
ORDER_STATUSES = ("placed", "shipped", "delivered", "cancelled")
_STATUS_CDF = np.cumsum([0.3, 0.3, 0.3, 0.1])[:-1]  # shares of the statuses of past orders

#: Text of the injected transient failure; an agent (and the oracle) recognise it to retry.
TRANSIENT_MARKER = "temporarily unavailable"


@dataclass(frozen=True)
class StoreData:
    """The initial content of one shop, as plain tuples (hashable, cached, never mutated)."""
    products: tuple[tuple[int, str, str, int], ...]            # product_id, name, category, price_cents
    locations: tuple[str, ...]                                  # store cities
    inventory: tuple[tuple[int, str, int], ...]                 # product_id, location, quantity
    customers: tuple[tuple[int, str, str, str], ...]            # customer_id, name, email, city
    orders: tuple[tuple[int, int, int, int, str, str, int], ...]  # order_id, customer, product, qty, location, status, total_cents
    return_days: int
    free_shipping_over_eur: int
    shipping_fee_cents: int
    delivery_days: int

    def product(self, product_id: int) -> tuple[int, str, str, int]:
        return next(p for p in self.products if p[0] == product_id)

    def customer(self, customer_id: int) -> tuple[int, str, str, str]:
        return next(c for c in self.customers if c[0] == customer_id)

    def stock(self, product_id: int) -> dict[str, int]:
        return {loc: q for pid, loc, q in self.inventory if pid == product_id}


@functools.lru_cache(maxsize=256)
def generate_store(seed: int) -> StoreData:
    """A shop drawn from ``seed`` (same seed, same shop). About 30 products, 3 stores, 12 customers.

    A share of products is *scarce* (a few units at one store only), so out-of-stock requests exist in
    every shop; the others have at least 4 units somewhere, so orders of 1-3 units can be filled.
    """
    rng = np.random.default_rng(seed)
    pairs = [(adj, noun, cat) for cat, nouns in CATALOG.items() for noun in nouns for adj in ADJECTIVES]
    picked = sorted((pairs[i] for i in rng.choice(len(pairs), size=30, replace=False)), key=lambda p: (p[2], p[1], p[0]))
    products, pid = [], int(rng.integers(100, 600))
    for adj, noun, cat in picked:
        lo, hi = _PRICE_RANGE_EUR[cat]
        cents = int(rng.integers(lo, hi)) * 100 + (0, 49, 99)[int(rng.integers(3))]
        products.append((pid, f"{adj} {noun}", cat, cents))
        pid += int(rng.integers(1, 9))
    locations = tuple(sorted(str(c) for c in rng.choice(CITIES, size=3, replace=False)))
    inventory = []
    for p in products:
        if rng.random() < 0.3:  # scarce: 1-3 units at a single store
            where = int(rng.integers(3))
            qty = [int(rng.integers(1, 4)) if k == where else 0 for k in range(3)]
        else:
            qty = [0 if rng.random() < 0.25 else int(rng.integers(2, 26)) for _ in range(3)]
            if max(qty) < 4:
                qty[int(rng.integers(3))] = int(rng.integers(4, 26))
        inventory.extend((p[0], loc, q) for loc, q in zip(locations, qty))
    names = [(f, l) for f in FIRST_NAMES for l in LAST_NAMES]
    customers, cid = [], int(rng.integers(1000, 5000))
    for i in rng.choice(len(names), size=12, replace=False):
        first, last = names[int(i)]
        customers.append((cid, f"{first} {last}", f"{first}.{last}@example.com".lower(), CITIES[int(rng.integers(len(CITIES)))]))
        cid += int(rng.integers(1, 8))
    orders, oid = [], int(rng.integers(20_000, 90_000))
    for k in range(14):
        c = customers[int(rng.integers(len(customers)))]
        p = products[int(rng.integers(len(products)))]
        q = int(rng.integers(1, 4))
        status = "placed" if k < 4 else ORDER_STATUSES[int(np.searchsorted(_STATUS_CDF, rng.random(), side="right"))]
        orders.append((oid, c[0], p[0], q, locations[int(rng.integers(3))], status, q * p[3]))
        oid += int(rng.integers(1, 40))
    return StoreData(tuple(products), locations, tuple(inventory), tuple(customers), tuple(orders),
                     return_days=int(rng.choice([14, 30, 60])), free_shipping_over_eur=int(rng.choice([25, 50, 75])),
                     shipping_fee_cents=int(rng.choice([399, 499, 595])), delivery_days=int(rng.choice([2, 3, 5])))


def _eur(cents: int) -> float:
    return round(cents / 100, 2)


# --------------------------------------------------------------------------- the backend
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


def goal_met(goal: Mapping[str, Any], data: StoreData, effects: Mapping[str, Any]) -> bool:
    """The final database is exactly the initial one plus the goal's orders and cancellations.

    New orders that were created and then cancelled again are ignored (their stock went back);
    every other difference — a missing or extra order, another status change, stock that does not
    add up — fails the task.
    """
    if effects["status_changes"] != {int(o): "cancelled" for o in goal.get("cancelled", [])}:
        return False
    active = [o for o in effects["new_orders"] if o["status"] != "cancelled"]
    if any(o["status"] != "placed" for o in active):
        return False
    wanted = list(goal.get("new_orders", []))
    if len(active) != len(wanted):
        return False
    remaining = list(active)
    for w in sorted(wanted, key=lambda w: w.get("location") is None):  # exact locations first
        hit = next((o for o in remaining if o["customer_id"] == w["customer_id"] and o["product_id"] == w["product_id"]
                    and o["quantity"] == w["quantity"] and w.get("location") in (None, o["location"])), None)
        if hit is None:
            return False
        remaining.remove(hit)
    expected = {(pid, loc): q for pid, loc, q in data.inventory}
    for o in active:
        expected[(o["product_id"], o["location"])] -= o["quantity"]
    old = {o[0]: o for o in data.orders}
    for oid in effects["status_changes"]:
        _, _, pid, q, loc, status, _ = old[oid]
        if status == "placed":
            expected[(pid, loc)] += q
    return expected == effects["stock"]


# --------------------------------------------------------------------------- answer checks
def answer_numbers(text: str) -> list[float]:
    """Numbers written in ``text`` (``1,234`` and ``24,99`` are read as 1234 and 24.99)."""
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    return [float(m.replace(",", ".")) for m in re.findall(r"(?<![\w.])\d+(?:[.,]\d+)?", text)]


def _mentions(text: str, phrase: str) -> bool:
    return re.search(r"(?<![a-z0-9])" + re.escape(phrase.lower()) + r"(?![a-z0-9])", text.lower()) is not None


def answer_ok(check: Mapping[str, Any] | None, answer: str, effects: Mapping[str, Any], goal: Mapping[str, Any]) -> bool:
    """Whether the answer states what the request asked for (``check`` kinds: number, order_id, text)."""
    if check is None or check.get("kind") == "none":
        return bool(answer.strip())
    kind = check["kind"]
    if kind == "number":
        return any(abs(x - float(check["value"])) < 0.005 for x in answer_numbers(answer))
    if kind == "order_id":  # the id of the order that fulfils the goal must be quoted
        ids = [o["order_id"] for o in effects["new_orders"] if o["status"] == "placed"
               and any(o["customer_id"] == w["customer_id"] and o["product_id"] == w["product_id"]
                       for w in goal.get("new_orders", []))]
        return any(float(i) in answer_numbers(answer) for i in ids)
    if kind == "text":  # one of ``values`` and none of ``exclude`` is mentioned
        return (any(_mentions(answer, v) for v in check["values"])
                and not any(_mentions(answer, v) for v in check.get("exclude", [])))
    raise ValueError(f"unknown answer check kind {kind!r}")


# --------------------------------------------------------------------------- tasks
#: family -> share of tasks (renormalised over the families an env is built with)
FAMILIES: dict[str, float] = {
    "no_tool": 0.14,               # the system prompt or the question holds the answer
    "price_lookup": 0.10,          # search_product
    "stock_check": 0.10,           # search_product -> check_inventory
    "customer_lookup": 0.08,       # find_customer
    "order_lookup": 0.10,          # get_order
    "place_order": 0.16,           # find_customer -> search_product -> create_order
    "cancel_order": 0.12,          # find_customer -> get_customer -> cancel_order (or cancel_order by id)
    "availability": 0.10,          # out-of-stock report: search_product -> check_inventory
    "out_of_stock_fallback": 0.10,  # preferred store lacks stock: ... -> check_inventory -> create_order elsewhere
}
_SPLIT_SEEDS = {"train": 0, "test": 1}
_RESULT_MATCHED = {"search_product": "product", "find_customer": "customer"}


class _Skip(Exception):
    """This shop cannot host the drawn family (e.g. no open order to cancel); draw another."""


def _call(name: str, arguments: dict[str, Any], *, target_id: int | None = None, optional: Sequence[str] = (),
          loose: Sequence[str] = ()) -> dict[str, Any]:
    """A gold plan step. Lookups (search/find) match when their results contain ``target_id``;
    other calls match on ``arguments`` (``optional`` keys may be left out, ``loose`` keys are free)."""
    step: dict[str, Any] = {"name": name, "arguments": arguments}
    if target_id is not None:
        step["target_id"] = target_id
    if optional:
        step["optional"] = list(optional)
    if loose:
        step["loose"] = list(loose)
    return step


def _pick(rng: np.random.Generator, items: Sequence[Any]) -> Any:
    if not items:
        raise _Skip
    return items[int(rng.integers(len(items)))]


def _money(cents: int) -> str:
    return f"{cents / 100:.2f} EUR"


def _build_task(family: str, data: StoreData, rng: np.random.Generator) -> dict[str, Any]:
    """One request of ``family`` over ``data``: prompt, gold plan, goal, answer check, oracle answer."""
    products = data.products
    stock = {p[0]: data.stock(p[0]) for p in products}
    goal: dict[str, Any] = {"new_orders": [], "cancelled": []}
    check: dict[str, Any] | None
    if family == "no_tool":
        if rng.random() < 0.5:
            options = [
                ("How many days do I have to return an item?", data.return_days, f"{data.return_days} days"),
                ("From what order value is shipping free (in EUR)?", data.free_shipping_over_eur,
                 f"Shipping is free from {data.free_shipping_over_eur} EUR."),
                ("How much does standard shipping cost?", data.shipping_fee_cents / 100, _money(data.shipping_fee_cents)),
                ("How many business days does standard delivery take?", data.delivery_days, f"{data.delivery_days} business days"),
            ]
            request, value, text = options[int(rng.integers(len(options)))]
        else:
            (q1, c1), (q2, c2) = [(int(rng.integers(1, 6)), int(rng.integers(3, 80)) * 100 + int(rng.choice([0, 50, 99])))
                                  for _ in range(2)]
            total = q1 * c1 + q2 * c2
            request = (f"I'm buying {q1} item(s) at {c1 / 100:.2f} EUR each and {q2} item(s) at {c2 / 100:.2f} EUR each. "
                       "What is the total before shipping?")
            value, text = total / 100, f"The total is {_money(total)}."
        plan, check, answer = [], {"kind": "number", "value": value}, text
    elif family == "price_lookup":
        pid, name, cat, cents = _pick(rng, products)
        request = str(rng.choice([f"How much does the {name} cost?", f"What is the price of the {name}?"]))
        plan = [_call("search_product", {"query": name}, target_id=pid)]
        check, answer = {"kind": "number", "value": cents / 100}, f"The {name} costs {_money(cents)}."
    elif family == "stock_check":
        pid, name, _, _ = _pick(rng, products)
        loc = _pick(rng, data.locations)
        qty = stock[pid][loc]
        request = f"How many units of the {name} are in stock at our {loc} store?"
        plan = [_call("search_product", {"query": name}, target_id=pid),
                _call("check_inventory", {"product_id": pid, "location": loc}, optional=["location"])]
        check, answer = {"kind": "number", "value": qty}, f"{loc} has {qty} unit(s) of the {name}."
    elif family == "customer_lookup":
        cid, cname, email, city = _pick(rng, data.customers)
        request = f"Which city is the customer with the email {email} registered in?"
        plan = [_call("find_customer", {"query": email}, target_id=cid)]
        check, answer = {"kind": "text", "values": [city]}, f"{cname} is registered in {city}."
    elif family == "order_lookup":
        oid, _, pid, _, _, status, _ = _pick(rng, data.orders)
        pname = data.product(pid)[1]
        plan = [_call("get_order", {"order_id": oid})]
        if rng.random() < 0.7:
            request = str(rng.choice([f"What is the status of order {oid}?", f"Can you check where my order #{oid} stands?"]))
            others = [s for s in ORDER_STATUSES if s != status]
            check, answer = {"kind": "text", "values": [status], "exclude": others}, f"Order {oid} is {status}."
        else:
            request = f"Which product is in order {oid}?"
            check, answer = {"kind": "text", "values": [pname]}, f"Order {oid} contains the {pname}."
    elif family == "place_order":
        cid, _, email, _ = _pick(rng, data.customers)
        q = int(rng.integers(1, 4))
        pid, name, _, _ = _pick(rng, [p for p in products if max(stock[p[0]].values()) >= q])
        loc = _pick(rng, [s for s, n in stock[pid].items() if n >= q]) if rng.random() < 0.5 else None
        where = f", shipped from our {loc} store" if loc else ""
        request = str(rng.choice([
            f"Please order {q} x {name} for the customer with the email {email}{where}. Tell me the order number.",
            f"Customer {email} would like {q} unit(s) of the {name}{where}. Place the order and give me its number."]))
        args = {"product_id": pid, "quantity": q, "customer_id": cid, **({"location": loc} if loc else {})}
        plan = [_call("find_customer", {"query": email}, target_id=cid),
                _call("search_product", {"query": name}, target_id=pid),
                _call("create_order", args)]
        goal["new_orders"] = [{"customer_id": cid, "product_id": pid, "quantity": q, "location": loc}]
        check, answer = {"kind": "order_id"}, "Done: order {order_id} is placed."
    elif family == "cancel_order":
        open_orders = [o for o in data.orders if o[5] == "placed"
                       and sum(p[1] == o[1] and p[2] == o[2] and p[5] == "placed" for p in data.orders) == 1]
        oid, cid, pid, _, _, _, _ = _pick(rng, open_orders)
        _, cname, email, _ = data.customer(cid)
        if rng.random() < 0.3:
            request = f"Please cancel order {oid}; I no longer need it."
            plan = [_call("cancel_order", {"order_id": oid})]
        else:
            request = f"Hi, this is {cname} ({email}). Please cancel my open order for the {data.product(pid)[1]}."
            plan = [_call("find_customer", {"query": email}, target_id=cid),
                    _call("get_customer", {"customer_id": cid}),
                    _call("cancel_order", {"order_id": oid})]
        goal["cancelled"] = [oid]
        check, answer = None, f"Order {oid} is cancelled."
    elif family == "availability":
        if rng.random() < 0.6:  # out of stock: fewer units in total than requested
            pid, name, _, _ = _pick(rng, [p for p in products if 0 < sum(stock[p[0]].values()) <= 8])
            total = sum(stock[pid].values())
            q = total + int(rng.integers(1, 4))
            check, answer = {"kind": "number", "value": total}, f"No single store can ship {q}; we have {total} in total."
        else:
            pid, name, _, _ = _pick(rng, [p for p in products if max(stock[p[0]].values()) >= 2])
            q = int(rng.integers(1, max(stock[pid].values()) + 1))
            stores = [s for s, n in stock[pid].items() if n >= q]
            check, answer = {"kind": "text", "values": stores}, f"Yes, {stores[0]} can ship all {q}."
        request = (f"A customer on the phone wants {q} units of the {name}. Can we ship all {q} from a single store? "
                   "If yes, name a store that can; if not, tell me how many units we have in total across all stores.")
        plan = [_call("search_product", {"query": name}, target_id=pid), _call("check_inventory", {"product_id": pid})]
    elif family == "out_of_stock_fallback":
        cid, _, email, _ = _pick(rng, data.customers)
        q = int(rng.integers(1, 4))
        candidates = [(p, s) for p in products for s in data.locations
                      if stock[p[0]][s] < q and max(stock[p[0]].values()) >= q]
        (pid, name, _, _), pref = _pick(rng, candidates)
        fallback = max(sorted(stock[pid]), key=lambda s: stock[pid][s])
        request = (f"Please order {q} x {name} for the customer {email}, shipped from our {pref} store. If {pref} "
                   f"cannot supply all {q}, ship from any store that can. Tell me the order number.")
        plan = [_call("find_customer", {"query": email}, target_id=cid),
                _call("search_product", {"query": name}, target_id=pid),
                _call("check_inventory", {"product_id": pid}, loose=["location"]),
                _call("create_order", {"product_id": pid, "quantity": q, "customer_id": cid, "location": fallback},
                      loose=["location"])]
        goal["new_orders"] = [{"customer_id": cid, "product_id": pid, "quantity": q, "location": None}]
        check, answer = {"kind": "order_id"}, "Done: order {order_id} is placed (from another store)."
    else:
        raise ValueError(f"unknown task family {family!r}; families: {sorted(FAMILIES)}")
    return {"family": family, "request": request, "plan": plan, "goal": goal, "answer_check": check,
            "oracle_answer": answer}


# --------------------------------------------------------------------------- reward shapers
def tool_f1(called: set[str] | frozenset[str], target: set[str] | frozenset[str]) -> float:
    """F1 of the called tool names against the target set (both empty: 1)."""
    if not called and not target:
        return 1.0
    hits = len(set(called) & set(target))
    if hits == 0:
        return 0.0
    p, r = hits / len(called), hits / len(target)
    return 2 * p * r / (p + r)


def _steps(event: StepEvent) -> list[tuple[str, Mapping[str, Any]]]:
    return [(r.action_type, r.info) for r in event.history] + [(event.action_type, event.info)]


@shaper("task_completion", terminal=True)
def task_completion(event: StepEvent) -> float:
    """1 if the episode ended with an answer and the database and answer checks pass."""
    return float(event.action_type == "answer" and bool(event.info.get("success")))


@shaper("tool_accuracy", terminal=True)
def tool_accuracy(event: StepEvent) -> float:
    """F1 of the tools called (by name, attempts included) against the task's target tools.

    Calling nothing on a no-tool task counts only when the episode ends with an answer: stalling
    until the turn limit is not a correct tool decision."""
    called = {str(i.get("tool")) for t, i in _steps(event) if t == "tool_call"}
    target = set(event.task.get("target_tools", ()))
    if not called and not target and event.action_type != "answer":
        return 0.0
    return tool_f1(called, target)


@shaper("efficiency", terminal=True)
def efficiency(event: StepEvent) -> float:
    """Optimal turns / turns taken, paid only for a completed task (a fast wrong answer earns nothing)."""
    if not (event.action_type == "answer" and event.info.get("success")):
        return 0.0
    return min(1.0, float(event.task.get("optimal_steps", 1)) / (event.turn + 1))


@shaper("timing", terminal=True)
def timing(event: StepEvent) -> float:
    """Share of well-timed decisions (calls while a needed tool is outstanding, answers once none is)."""
    marks = [bool(i["timely"]) for _, i in _steps(event) if "timely" in i]
    return sum(marks) / len(marks) if marks else 0.0


@shaper("format", terminal=True)
def format_compliance(event: StepEvent) -> float:
    """Share of turns holding exactly one well-formed action (one valid tool call or one answer)."""
    steps = _steps(event)
    return sum(bool(i.get("well_formed")) for _, i in steps) / len(steps)


@shaper("wrong_tool")
def wrong_tool(event: StepEvent) -> float:
    """-1 for a call to a tool outside the task's target set (unknown tools included)."""
    return -1.0 if event.action_type == "tool_call" and not event.info.get("in_target") else 0.0


@shaper("redundant_call")
def redundant_call(event: StepEvent) -> float:
    """-1 for a call identical (name and arguments) to an earlier successful one; retries after errors are free."""
    return -1.0 if event.info.get("redundant") else 0.0


@shaper("format_error")
def format_error(event: StepEvent) -> float:
    """-1 for an action that could not be parsed or a call whose arguments violate the tool's schema."""
    return -1.0 if event.action_type == "invalid" or event.info.get("tool_error") == "invalid_arguments" else 0.0


#: the seed design's defaults: (shaper, weight); penalties return -1, so weights stay positive
DEFAULT_TERMS: tuple[tuple[Any, float], ...] = (
    (task_completion, 0.4), (tool_accuracy, 0.25), (efficiency, 0.15), (timing, 0.10), (format_compliance, 0.10),
    (wrong_tool, 0.3), (redundant_call, 0.2), (format_error, 0.1), (TurnLimitPenalty(name="timeout"), 0.5),
)


# --------------------------------------------------------------------------- the env
def _safe(text: str) -> str:
    """Text that is valid UTF-8 (a model's lone surrogates must not reach an observation)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _canonical(value: Any) -> str:
    """A key for "the same call": JSON with sorted keys (``repr`` for pathologically deep arguments)."""
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=True, default=str)
    except (RecursionError, ValueError):
        return repr(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().casefold() == b.strip().casefold()
    return a == b


def _describe_tools(tools: ToolSet) -> str:
    """One line per tool: ``name(arg: type, opt?: type): description`` (for templates without tools=)."""
    lines = []
    for t in tools.tools.values():
        required = set(t.parameters.get("required", []))
        args = []
        for key, prop in t.parameters.get("properties", {}).items():
            kind = prop.get("type", "string")
            kind = next(k for k in ([kind] if isinstance(kind, str) else kind) if k != "null")
            if "enum" in prop:
                kind = "|".join(str(v) for v in prop["enum"] if v is not None)
            args.append(f"{key}{'' if key in required else '?'}: {kind}")
        lines.append(f"- {t.name}({', '.join(args)}): {t.description}")
    return "\n".join(lines)


class ToolCallEnv(AgentEnv):
    """Retail customer support with seven tools over a per-episode SQLite store.

    Args:
        split: ``"train"`` or ``"test"`` — disjoint procedural task streams (shops and requests).
        families: task families to draw from (default: all of :data:`FAMILIES`, at their shares).
        transient_rate: share of tool-using tasks whose first call to one plan tool fails with a
            retryable "temporarily unavailable" error.
        max_turns: turns before the episode is truncated (the ``timeout`` penalty).
        reward: a custom :class:`~agentgym.Reward` or new weights for the default terms.
        tools_in_prompt: also list the tools in the system prompt (for chat templates without
            ``tools=`` support, e.g. SmolLM2's); turn off when the template renders ``tool_specs()``.

    ``info`` of a tool step: ``tool``, ``tool_ok``, ``tool_error``, ``transient``, ``in_target``,
    ``redundant``, ``args_ok``, ``timely``, ``well_formed``; of the answer step: ``db_ok``,
    ``answer_ok``, ``success``. The task (``info["privileged"]["task"]``) holds the gold plan, target
    tools, optimal turns and the goal: privileged, never shown to the policy.
    """

    stop_strings = ("</tool_call>", "</answer>")
    num_tasks = None
    tool_action_types = ("tool_call",)

    def __init__(self, split: str = "train", families: Sequence[str] | None = None, transient_rate: float = 0.2,
                 max_turns: int = 10, reward: Reward | Mapping[str, float] | None = None,
                 tools_in_prompt: bool = True, max_action_chars: int = 16_384, render_mode: str | None = None,
                 group_reward: Any = None):
        if split not in _SPLIT_SEEDS:
            raise ValueError(f"split must be one of {sorted(_SPLIT_SEEDS)}, got {split!r}")
        families = list(FAMILIES) if families is None else list(families)
        unknown = set(families) - set(FAMILIES)
        if unknown or not families:
            raise ValueError(f"families must be a non-empty subset of {sorted(FAMILIES)}; unknown: {sorted(unknown)}")
        if not 0.0 <= transient_rate <= 1.0:
            raise ValueError(f"transient_rate must be in [0, 1], got {transient_rate}")
        self.split, self.transient_rate, self.tools_in_prompt = split, float(transient_rate), bool(tools_in_prompt)
        self.families = families
        shares = np.array([FAMILIES[f] for f in families], dtype=float)
        self._family_p = shares / shares.sum()
        self.store = RetailStore()
        self.tools = ToolSet(self.store.tools(), timeout_s=None)  # SQLite calls are fast: no worker thread
        self._calls: list[dict[str, Any]] = []
        self._success = False
        super().__init__(reward=reward, max_turns=max_turns, max_action_chars=max_action_chars, render_mode=render_mode,
                         group_reward=group_reward)

    # ------------------------------------------------------------------ tasks
    def default_reward(self) -> Reward:
        return Reward(list(DEFAULT_TERMS))

    def get_task(self, index: int) -> dict[str, Any]:
        rng = np.random.default_rng([_SPLIT_SEEDS[self.split], int(index)])
        db_seed = int(rng.integers(2**62))
        data = generate_store(db_seed)
        family = self.families[int(rng.choice(len(self.families), p=self._family_p))]
        for _ in range(20):
            try:
                task = _build_task(family, data, rng)
                break
            except _Skip:  # this shop lacks what the family needs: draw another family
                family = self.families[int(rng.choice(len(self.families), p=self._family_p))]
        else:  # pragma: no cover - every generated shop hosts price lookups
            task = _build_task("price_lookup", data, rng)
        plan = task["plan"]
        transient = None
        if plan and rng.random() < self.transient_rate:
            names = list(dict.fromkeys(s["name"] for s in plan))
            transient = names[int(rng.integers(len(names)))]
        task.update(split=self.split, db_seed=db_seed, transient_tool=transient,
                    target_tools=sorted({s["name"] for s in plan}),
                    optimal_steps=len(plan) + 1 + (transient is not None))
        return task

    def initial_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt(generate_store(int(task["db_seed"])))},
                {"role": "user", "content": str(task["request"])}]

    def system_prompt(self, data: StoreData) -> str:
        """The agent's instructions and the shop's public facts (what no-tool tasks are answered from)."""
        tools = f"Tools:\n{_describe_tools(self.tools)}\n\n" if self.tools_in_prompt else ""
        return (
            "You are the customer-support agent of an online shop. Use the shop's tools to look things up or to "
            "change orders; answer directly when no tool is needed, since every call costs time.\n"
            "Call one tool per turn, exactly like this:\n"
            '<tool_call>{"name": "search_product", "arguments": {"query": "travel kettle"}}</tool_call>\n'
            "Its result comes back in the next message. When you are done, write your reply to the user inside "
            "<answer>...</answer>; this ends the conversation. State the facts asked for in the answer (prices in "
            "EUR, quantities, order numbers, store names, order status).\n\n"
            f"{tools}"
            f"Shop facts: stores in {', '.join(data.locations)}. Returns are accepted within {data.return_days} days "
            f"of delivery. Standard shipping costs {_money(data.shipping_fee_cents)} and is free for orders of "
            f"{data.free_shipping_over_eur} EUR or more. Standard delivery takes {data.delivery_days} business days."
        )

    def tool_specs(self) -> list[dict[str, Any]]:
        return self.tools.specs()

    def on_reset(self, task: Mapping[str, Any]) -> None:
        missing = {"db_seed", "request", "plan", "goal", "target_tools", "optimal_steps"} - set(task)
        if missing:
            raise ValueError(f"a ToolCall task needs the keys {sorted(missing)}; take tasks from get_task()")
        self.store.load(generate_store(int(task["db_seed"])), fail_first=task.get("transient_tool"))
        self._calls = []
        self._success = False

    # ------------------------------------------------------------------ one turn
    def transition(self, action: str) -> Transition:
        blocks = action.count("<tool_call>") + action.count("<answer>")
        tag = first_tag(action, ("tool_call", "answer"))
        if tag is None:
            parsed = parse_tool_calls(action)  # an unclosed <tool_call> gets its own message
            why = parsed.errors[0] if parsed.errors else "no <tool_call> or <answer> found"
            return self.invalid(_safe(f"Invalid action: {why}. Call one tool as <tool_call>{{\"name\": ..., "
                                      "\"arguments\": {...}}</tool_call> or reply with <answer>...</answer>."),
                                well_formed=False)
        if tag.tag == "answer":
            return self._answer(action, tag.content, blocks)
        parsed = parse_tool_calls(action[tag.start:tag.end])
        if parsed.errors:
            return self.invalid(_safe(f"Invalid tool call: {parsed.errors[0]}. Write <tool_call>{{\"name\": \"TOOL\", "
                                      "\"arguments\": {...}}</tool_call> with valid JSON."),
                                parsed=parsed, well_formed=False)
        return self._tool_call(action, parsed.calls[0], blocks)

    def _outstanding(self) -> set[str]:
        return set(self.task["target_tools"]) - {c["name"] for c in self._calls if c["ok"]}

    def _tool_call(self, action: str, call: Any, blocks: int) -> Transition:
        outstanding = self._outstanding()
        self.store.transient_fired = False
        result = self.tools.call(call.name, call.arguments)
        key = _canonical([call.name, call.arguments])
        valid = result.error not in ("unknown_tool", "invalid_arguments")
        record = {"name": _safe(call.name), "arguments": call.arguments, "key": key, "ok": result.ok,
                  "transient": self.store.transient_fired, "in_target": call.name in self.task["target_tools"],
                  "args_ok": valid and self._args_ok(call.name, call.arguments)}
        redundant = any(c["key"] == key and c["ok"] for c in self._calls)
        self._calls.append(record)
        messages = [{"role": "tool", "name": record["name"], "content": _safe(result.content)}]
        if blocks > 1:
            messages.append({"role": "user", "content": "Only your first tool call was used. Write one tool call or "
                                                        "one answer per turn, and answer after seeing the results."})
        info = {"tool": record["name"], "tool_ok": result.ok, "tool_error": result.error,
                "transient": record["transient"], "in_target": record["in_target"], "redundant": redundant,
                "args_ok": record["args_ok"], "timely": bool(outstanding) and "<answer>" not in action,
                "well_formed": blocks == 1 and result.error != "invalid_arguments"}
        return Transition(messages, "tool_call", parsed=call, info=info)

    def _answer(self, action: str, answer: str, blocks: int) -> Transition:
        if not answer:
            return self.invalid("Invalid action: the <answer> is empty. Write your reply to the user inside "
                                "<answer>...</answer>.", well_formed=False)
        effects = self.store.effects()
        assert self.store.data is not None
        db_ok = goal_met(self.task["goal"], self.store.data, effects)
        text_ok = answer_ok(self.task.get("answer_check"), answer, effects, self.task["goal"])
        self._success = bool(db_ok and text_ok)
        info = {"db_ok": db_ok, "answer_ok": text_ok, "success": self._success, "well_formed": blocks == 1,
                "timely": not self._outstanding() and "<tool_call>" not in action}
        return Transition([], "answer", parsed=answer, terminated=True, answer=answer, info=info)

    # ------------------------------------------------------------------ gold-plan matching
    def _step_matches(self, step: Mapping[str, Any], name: str, args: Mapping[str, Any]) -> bool:
        if step["name"] != name:
            return False
        if name in _RESULT_MATCHED:  # a lookup is right when its results contain the wanted record
            try:
                found = (self.store.search_ids(args["query"], args.get("category")) if name == "search_product"
                         else self.store.customer_ids(args["query"]))
            except (StoreError, sqlite3.Error, UnicodeError, KeyError):
                return False
            return step["target_id"] in found
        for key, gold in step["arguments"].items():
            if key in step.get("loose", ()):
                continue
            if args.get(key) is None and key in step.get("optional", ()):
                continue
            if not _same(args.get(key), gold):
                return False
        return True

    def _args_ok(self, name: str, args: Mapping[str, Any]) -> bool:
        return any(self._step_matches(s, name, args) for s in self.task["plan"])

    # ------------------------------------------------------------------ episode end
    def episode_success(self) -> bool:
        return self._success

    def episode_metrics(self) -> dict[str, Any]:
        target = set(self.task["target_tools"])
        calls = self._calls
        on_target = [c for c in calls if c["in_target"]]
        if on_target:
            arg_acc = sum(c["args_ok"] for c in on_target) / len(on_target)
        else:
            arg_acc = 0.0 if target else 1.0
        plan, k = self.task["plan"], 0
        for c in calls:  # the gold plan must appear, in order, among the successful calls
            if k < len(plan) and c["ok"] and self._step_matches(plan[k], c["name"], c["arguments"]):
                k += 1
        plan_success = k == len(plan) and all(c["in_target"] for c in calls)
        return {
            "family": self.task.get("family"),
            "tool_selection_accuracy": tool_f1({c["name"] for c in calls}, target),
            "argument_accuracy": arg_acc,
            "plan_success": plan_success,
            "step_efficiency": min(1.0, self.task["optimal_steps"] / max(1, self.turn)),
            "end_to_end_success": self._success,
            "optimal_steps": self.task["optimal_steps"],
            "transient_injected": self.task.get("transient_tool") is not None,
            "transient_recovered": any(c["transient"] for c in calls) and self._success,
        }

    # ------------------------------------------------------------------ reference policy
    @staticmethod
    def oracle(context: Mapping[str, Any]) -> str:
        """Replays the gold plan from the privileged task, one call per turn, reading the tool results in
        ``context["messages"]``: a transient error is retried with the same call, and the final answer
        quotes the order number that ``create_order`` returned."""
        task = context["task"]
        results = [m for m in context.get("messages", []) if m.get("role") == "tool"]
        done = sum(TRANSIENT_MARKER not in m.get("content", "") for m in results)
        plan = task["plan"]
        if done < len(plan):
            step = plan[done]
            return "<tool_call>" + json.dumps({"name": step["name"], "arguments": step["arguments"]}) + "</tool_call>"
        answer = str(task["oracle_answer"])
        if "{order_id}" in answer:
            order_id = "?"
            for m in reversed(results):
                if m.get("name") == "create_order" and not m.get("content", "").startswith("Error"):
                    try:
                        order_id = str(json.loads(m["content"])["order_id"])
                    except (ValueError, KeyError, TypeError):
                        continue
                    break
            answer = answer.replace("{order_id}", order_id)
        return f"<answer>{answer}</answer>"

    def close(self) -> None:
        self.store.close()
        self.tools.close()
