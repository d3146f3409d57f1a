"""ToolCall-v0's task families: a request, its gold plan of tool calls, the goal on the final database
and the answer check, built from a generated store; and each split's task sequence.

Splits: what the agent is shown of a task is its shop's public facts and the request
(:func:`task_key`); a task belongs to the split a hash of that text names
(:func:`agentgym.splits.split_of`), so ``train``, ``validation`` and ``test`` never show the same
task (two shops with the same facts asked the same policy question are one task), and within a split
index ``i`` never repeats an earlier index's task (:class:`agentgym.splits.DistinctDraws`)."""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable, Sequence

import numpy as np

from agentgym.splits import DistinctDraws, normalise_task_text, split_of

from .store import ORDER_STATUSES, StoreData, generate_store

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
_SPLIT_SEEDS = {"train": 0, "test": 1, "validation": 2}  # split -> seed of its candidate stream
#: indices of a split built in order with no repeat (a candidate generates a shop: ~1 ms)
DISTINCT_TASKS = 2_000
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


# A family builder draws one request over ``data`` and returns (request, gold plan, answer check, oracle
# answer); builders whose task changes the database also fill in ``goal``. The draws' order is the task set.
_Built = tuple[str, list[dict[str, Any]], dict[str, Any] | None, str]
_Stock = dict[int, dict[str, int]]


def _no_tool(data: StoreData, rng: np.random.Generator, stock: _Stock, goal: dict[str, Any]) -> _Built:
    """A policy question (the system prompt holds the answer) or arithmetic over the request itself."""
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
    return request, [], {"kind": "number", "value": value}, text


def _price_lookup(data: StoreData, rng: np.random.Generator, stock: _Stock, goal: dict[str, Any]) -> _Built:
    pid, name, cat, cents = _pick(rng, data.products)
    request = str(rng.choice([f"How much does the {name} cost?", f"What is the price of the {name}?"]))
    plan = [_call("search_product", {"query": name}, target_id=pid)]
    return request, plan, {"kind": "number", "value": cents / 100}, f"The {name} costs {_money(cents)}."


def _stock_check(data: StoreData, rng: np.random.Generator, stock: _Stock, goal: dict[str, Any]) -> _Built:
    pid, name, _, _ = _pick(rng, data.products)
    loc = _pick(rng, data.locations)
    qty = stock[pid][loc]
    request = f"How many units of the {name} are in stock at our {loc} store?"
    plan = [_call("search_product", {"query": name}, target_id=pid),
            _call("check_inventory", {"product_id": pid, "location": loc}, optional=["location"])]
    return request, plan, {"kind": "number", "value": qty}, f"{loc} has {qty} unit(s) of the {name}."


def _customer_lookup(data: StoreData, rng: np.random.Generator, stock: _Stock, goal: dict[str, Any]) -> _Built:
    cid, cname, email, city = _pick(rng, data.customers)
    request = f"Which city is the customer with the email {email} registered in?"
    plan = [_call("find_customer", {"query": email}, target_id=cid)]
    return request, plan, {"kind": "text", "values": [city]}, f"{cname} is registered in {city}."


def _order_lookup(data: StoreData, rng: np.random.Generator, stock: _Stock, goal: dict[str, Any]) -> _Built:
    """The order's status (other statuses count as wrong) or its product."""
    oid, _, pid, _, _, status, _ = _pick(rng, data.orders)
    pname = data.product(pid)[1]
    plan = [_call("get_order", {"order_id": oid})]
    if rng.random() < 0.7:
        request = str(rng.choice([f"What is the status of order {oid}?", f"Can you check where my order #{oid} stands?"]))
        others = [s for s in ORDER_STATUSES if s != status]
        return request, plan, {"kind": "text", "values": [status], "exclude": others}, f"Order {oid} is {status}."
    request = f"Which product is in order {oid}?"
    return request, plan, {"kind": "text", "values": [pname]}, f"Order {oid} contains the {pname}."


def _place_order(data: StoreData, rng: np.random.Generator, stock: _Stock, goal: dict[str, Any]) -> _Built:
    """Order a product some store has enough of, from a named store half of the time."""
    cid, _, email, _ = _pick(rng, data.customers)
    q = int(rng.integers(1, 4))
    pid, name, _, _ = _pick(rng, [p for p in data.products if max(stock[p[0]].values()) >= q])
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
    return request, plan, {"kind": "order_id"}, "Done: order {order_id} is placed."


def _cancel_order(data: StoreData, rng: np.random.Generator, stock: _Stock, goal: dict[str, Any]) -> _Built:
    """Cancel an open order, by id or by naming its (only open) product for that customer."""
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
    return request, plan, None, f"Order {oid} is cancelled."


def _availability(data: StoreData, rng: np.random.Generator, stock: _Stock, goal: dict[str, Any]) -> _Built:
    """Can one store ship q units? If none can, the answer is the total across stores."""
    products = data.products
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
    return request, plan, check, answer


def _out_of_stock_fallback(data: StoreData, rng: np.random.Generator, stock: _Stock,
                           goal: dict[str, Any]) -> _Built:
    """The preferred store lacks stock; the order must go to a store that has it."""
    cid, _, email, _ = _pick(rng, data.customers)
    q = int(rng.integers(1, 4))
    candidates = [(p, s) for p in data.products for s in data.locations
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
    return request, plan, {"kind": "order_id"}, "Done: order {order_id} is placed (from another store)."


_BUILDERS: dict[str, Callable[[StoreData, np.random.Generator, _Stock, dict[str, Any]], _Built]] = {
    "no_tool": _no_tool, "price_lookup": _price_lookup, "stock_check": _stock_check,
    "customer_lookup": _customer_lookup, "order_lookup": _order_lookup, "place_order": _place_order,
    "cancel_order": _cancel_order, "availability": _availability, "out_of_stock_fallback": _out_of_stock_fallback,
}


def _build_task(family: str, data: StoreData, rng: np.random.Generator) -> dict[str, Any]:
    """One request of ``family`` over ``data``: prompt, gold plan, goal, answer check, oracle answer."""
    stock = {p[0]: data.stock(p[0]) for p in data.products}
    goal: dict[str, Any] = {"new_orders": [], "cancelled": []}
    if family not in _BUILDERS:
        raise ValueError(f"unknown task family {family!r}; families: {sorted(FAMILIES)}")
    request, plan, check, answer = _BUILDERS[family](data, rng, stock, goal)
    return {"family": family, "request": request, "plan": plan, "goal": goal, "answer_check": check,
            "oracle_answer": answer}


def shop_facts(data: StoreData) -> str:
    """The shop's public facts, as the system prompt states them (what no-tool tasks are answered from)."""
    return (f"Shop facts: stores in {', '.join(data.locations)}. Returns are accepted within {data.return_days} days "
            f"of delivery. Standard shipping costs {_money(data.shipping_fee_cents)} and is free for orders of "
            f"{data.free_shipping_over_eur} EUR or more. Standard delivery takes {data.delivery_days} business days.")


def task_key(task: dict[str, Any]) -> str:
    """What the agent is shown of a task (its shop's facts and the request), normalised: one key, one task."""
    return normalise_task_text(shop_facts(generate_store(int(task["db_seed"]))) + "\n" + str(task["request"]))


def _draw_task(split: str, families: tuple[str, ...], transient_rate: float, index: int, attempt: int) -> dict[str, Any]:
    """Candidate ``attempt`` for task ``index`` of ``split`` (attempt 0: the stream of the splits' first version)."""
    rng = np.random.default_rng([_SPLIT_SEEDS[split], int(index)] + ([attempt] if attempt else []))
    shares = np.array([FAMILIES[f] for f in families], dtype=float)
    family_p = shares / shares.sum()
    db_seed = int(rng.integers(2**62))
    data = generate_store(db_seed)
    family = families[int(rng.choice(len(families), p=family_p))]
    for _ in range(20):
        try:
            task = _build_task(family, data, rng)
            break
        except _Skip:  # this shop lacks what the family needs: draw another family
            family = families[int(rng.choice(len(families), p=family_p))]
    else:  # pragma: no cover - every generated shop hosts price lookups
        task = _build_task("price_lookup", data, rng)
    plan = task["plan"]
    transient = None
    if plan and rng.random() < transient_rate:
        names = list(dict.fromkeys(s["name"] for s in plan))
        transient = names[int(rng.integers(len(names)))]
    task.update(split=split, db_seed=db_seed, transient_tool=transient, target_tools=sorted({s["name"] for s in plan}),
                optimal_steps=len(plan) + 1 + (transient is not None))
    return task


@functools.lru_cache(maxsize=16)
def _split_tasks(split: str, families: tuple[str, ...], transient_rate: float) -> DistinctDraws:
    return DistinctDraws(split, functools.partial(_draw_task, split, families, transient_rate), key=task_key,
                         in_split=lambda t: split_of(task_key(t)) == split, prefix=DISTINCT_TASKS)


def split_task(split: str, families: Sequence[str], transient_rate: float, index: int) -> dict[str, Any]:
    """Task ``index`` of ``split`` drawn from ``families`` (a fresh copy: callers may mutate it)."""
    return copy.deepcopy(_split_tasks(split, tuple(families), float(transient_rate)).get(index))
