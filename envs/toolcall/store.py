"""The shop behind ToolCall-v0: its procedurally generated content (:class:`StoreData`,
:func:`generate_store`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

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
