"""A fictional encyclopedia world, generated from a seed, rendered as a Search-R1 corpus.

Why a fictional world: a language model cannot know the answer to "In which city was Dravik Olune
born?" from pre-training, so the only way to answer is to search the corpus. That makes *when*
and *what* to search a real decision, and lets the bundled environment run offline at any size.

The world is a set of entities (people, countries, cities, rivers, mountains, companies,
universities, bands) with attributes and relations. Every statement a passage makes is recorded
as a canonical fact ``(subject_id, relation, value)``, so question generation can check that a
question's answer is stated one way only across the whole corpus and can name the passages that
state it (the gold passages).

Names come from a syllable generator, are unique across the world (after Search-R1 answer
normalisation) and are checked against a short list of well-known real names. An invented word can
still coincide with an obscure real place; the facts about it are invented all the same.

Determinism: one :class:`random.Random` per purpose, seeded with a string (``random.Random``
hashes string seeds with SHA-512, which is stable across processes and Python versions). No global
random state is touched.

Layout: the word lists and the name generator live in :mod:`.lexicon`, the passage renderers in
:mod:`.render`; this module holds the entities, their generation and the :class:`World` index.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from agentgym.rewards import normalize_answer

from .lexicon import BAND_PATTERNS, COMPANY_SUFFIXES, GENRES, INDUSTRIES, PROFESSIONS, UNIVERSITY_PATTERNS, NameForge
from .render import Passage, render_passages

__all__ = ["World", "Entity", "build_world", "WORLD_SIZES", "ENTITY_RELATIONS"]

# (n_people, n_places, n_orgs) per named size.
WORLD_SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (40, 24, 16),
    "small": (150, 80, 50),
    "medium": (2000, 700, 600),
    "large": (20000, 6000, 5000),
}

# Relations whose value is another entity's id (all others hold a literal: int or str).
ENTITY_RELATIONS: frozenset[str] = frozenset({
    "born_in", "studied_at", "worked_for", "member_of", "married_to",
    "country", "on_river", "capital", "highest_mountain", "source",
    "first_climbed_by", "founder", "headquarters", "city", "origin",
})


@dataclass(eq=False)
class Entity:
    """One thing in the world; ``attrs`` maps relation → value (entity id or literal)."""

    id: str
    kind: str
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)
    gender: str | None = None  # people only: "f" or "m", for pronouns


_PRESENT = 2024  # no event in the world happens after this year


def _later(rng: random.Random, year: int, lo: int, hi: int) -> int:
    """``year`` + a random gap in [lo, hi], never past the present."""
    return year + rng.randint(lo, max(lo, min(hi, _PRESENT - year)))


def _take(pool: list[Entity], born_by: int) -> Entity | None:
    """Remove and return the last person in ``pool`` born in or before ``born_by``."""
    for i in range(len(pool) - 1, -1, -1):
        if pool[i].attrs["birth_year"] <= born_by:
            return pool.pop(i)
    return None


def _split_counts(total: int, shares: tuple[float, ...], minimum: int) -> list[int]:
    return [max(minimum, int(round(total * s))) for s in shares]




def _by_country(entities: list[Entity]) -> dict[str, list[Entity]]:
    """Group entities by their ``country`` attribute, keeping generation order within each group."""
    groups: dict[str, list[Entity]] = {}
    for e in entities:
        groups.setdefault(e.attrs["country"], []).append(e)
    return groups


# ----------------------------------------------------------------------------- generation
class _Builder:
    """What one world's generation threads through its steps: the two RNGs and the entities so far.

    The steps below run in a fixed order and each draws from ``rng`` in a fixed order: that order
    *is* the world for a seed, so reordering any draw changes every generated world.
    """

    def __init__(self, seed: int):
        self.rng = random.Random(f"agentgym.searchqa.world:{seed}")
        self.forge = NameForge(random.Random(f"agentgym.searchqa.names:{seed}"))
        self.ents: dict[str, Entity] = {}
        self._counts: dict[str, int] = {}

    def add(self, kind: str, name: str, **attrs: Any) -> Entity:
        """A new entity with the next id of its kind (``"city:0"``, ``"city:1"``, …)."""
        self._counts[kind] = self._counts.get(kind, 0) + 1
        e = Entity(id=f"{kind}:{self._counts[kind] - 1}", kind=kind, name=name, attrs=dict(attrs))
        self.ents[e.id] = e
        return e

    def unique(self, make: Callable[[], str]) -> str:
        """Draw names with ``make`` until one is free, and claim it."""
        while True:
            name = make()
            if self.forge.claim(name):
                return name


def _countries(b: _Builder, n: int) -> list[Entity]:
    countries = []
    for _ in range(n):
        c = b.add("country", b.forge.word(2, 3), established_year=b.rng.randint(1300, 1975),
                  language=b.forge.word(2, 3) + b.rng.choice(("ic", "ish", "ese", "ian", "i")),
                  currency=b.forge.word(2, 2).lower())
        b.forge.claim(c.attrs["language"]); b.forge.claim(c.attrs["currency"])
        countries.append(c)
    return countries


def _cities(b: _Builder, countries: list[Entity], n: int) -> list[Entity]:
    """Every country gets at least one city; its most populous city is its capital."""
    rng, cities = b.rng, []
    for i in range(n):
        country = countries[i] if i < len(countries) else rng.choice(countries)
        cities.append(b.add("city", b.forge.word(2, 3), country=country.id,
                            population=rng.randint(8, 4000) * 1000 + rng.randint(0, 999),
                            founded_year=rng.randint(700, 1850)))
    cities_in = _by_country(cities)
    for country in countries:
        own = cities_in[country.id]
        capital = max(own, key=lambda c: c.attrs["population"])
        country.attrs["capital"] = capital.id
        total = sum(c.attrs["population"] for c in own)
        country.attrs["population"] = int(total * rng.uniform(1.5, 4.0)) // 1000 * 1000
    return cities


def _mountains(b: _Builder, countries: list[Entity], n: int) -> list[Entity]:
    """Distinct heights, so "the highest mountain in X" is unambiguous."""
    heights = b.rng.sample(range(900, 8200), n)
    mountains = []
    for h in heights:
        name = f"Mount {b.forge.word(2, 3)}"
        b.forge.claim(name)
        mountains.append(b.add("mountain", name, country=b.rng.choice(countries).id, height_m=h))
    mountains_in = _by_country(mountains)
    for country in countries:
        own = mountains_in.get(country.id, [])
        if own:
            country.attrs["highest_mountain"] = max(own, key=lambda m: m.attrs["height_m"]).id
    return mountains


def _rivers(b: _Builder, countries: list[Entity], cities: list[Entity], mountains: list[Entity],
            n: int) -> list[Entity]:
    """Rivers rise on a mountain of their country (often) and flow past its cities (some)."""
    rng, rivers = b.rng, []
    mountains_in = _by_country(mountains)
    for _ in range(n):
        name = f"{b.forge.word(2, 3)} River"
        b.forge.claim(name)
        country = rng.choice(countries)
        r = b.add("river", name, country=country.id, length_km=rng.randint(40, 3500))
        own = mountains_in.get(country.id, [])
        if own and rng.random() < 0.7:
            r.attrs["source"] = rng.choice(own).id
        rivers.append(r)
    rivers_in = _by_country(rivers)
    for city in cities:
        own = rivers_in.get(city.attrs["country"], [])
        if own and rng.random() < 0.5:
            city.attrs["on_river"] = rng.choice(own).id
    return rivers


def _people(b: _Builder, cities: list[Entity], n: int) -> list[Entity]:
    """A shared pool of given names and surnames; full names unique."""
    rng = b.rng
    first_pool = [b.forge.word(2, 3) for _ in range(max(24, n // 3))]
    last_pool = [b.forge.word(2, 3) for _ in range(max(32, n // 2))]
    people = []
    for _ in range(n):
        name = b.unique(lambda: f"{rng.choice(first_pool)} {rng.choice(last_pool)}")
        p = b.add("person", name, birth_year=rng.randint(1930, 2002), born_in=rng.choice(cities).id)
        p.gender = rng.choice("fm")
        people.append(p)
    return people


def _bands(b: _Builder, pool: list[Entity], cities: list[Entity], n: int) -> list[Entity]:
    """Bands take 2–4 musicians each from ``pool`` (removing them), while enough people are left."""
    rng, bands = b.rng, []
    for _ in range(n):
        size = rng.randint(2, 4)
        if len(pool) < size + 2:
            break
        members = [pool.pop() for _ in range(size)]
        name = b.unique(lambda: rng.choice(BAND_PATTERNS).format(w=b.forge.word(2, 3)))
        band = b.add("band", name, genre=rng.choice(GENRES), origin=rng.choice(cities).id,
                     formed_year=_later(rng, max(m.attrs["birth_year"] for m in members), 16, 24))
        for m in members:
            m.attrs["profession"] = "musician"
            m.attrs["member_of"] = band.id
        bands.append(band)
    return bands


def _first_ascents(b: _Builder, pool: list[Entity], mountains: list[Entity]) -> None:
    """Most mountains were first climbed by a mountaineer taken from ``pool``."""
    for m in mountains:
        climber = _take(pool, born_by=_PRESENT - 20)
        if climber is not None and b.rng.random() < 0.8:
            climber.attrs["profession"] = "mountaineer"
            m.attrs["first_climbed_by"] = climber.id
            m.attrs["first_ascent_year"] = _later(b.rng, climber.attrs["birth_year"], 20, 40)


def _companies(b: _Builder, pool: list[Entity], cities: list[Entity], n: int) -> list[Entity]:
    """Each company has a founder taken from ``pool``; stops when nobody old enough is left."""
    rng, companies = b.rng, []
    for _ in range(n):
        founder = _take(pool, born_by=_PRESENT - 24)
        if founder is None:
            break
        name = f"{b.forge.word(2, 3)} {rng.choice(COMPANY_SUFFIXES)}"
        b.forge.claim(name)
        companies.append(b.add("company", name, founder=founder.id, industry=rng.choice(INDUSTRIES),
                               headquarters=rng.choice(cities).id,
                               founded_year=_later(rng, founder.attrs["birth_year"], 24, 50)))
    return companies


def _universities(b: _Builder, cities: list[Entity], n: int) -> list[Entity]:
    rng, universities = b.rng, []
    for _ in range(n):
        name = b.unique(lambda: rng.choice(UNIVERSITY_PATTERNS).format(w=b.forge.word(2, 3)))
        city = rng.choice(cities)
        universities.append(b.add("university", name, city=city.id,
                                  founded_year=rng.randint(max(1400, city.attrs["founded_year"] + 30), 1965)))
    return universities


def _careers(b: _Builder, people: list[Entity], companies: list[Entity], universities: list[Entity]) -> None:
    """Professions, studies and jobs, only at institutions that existed by then (sorted + bisect keeps it linear)."""
    rng = b.rng
    founders = {c.attrs["founder"] for c in companies}
    unis = sorted(universities, key=lambda u: u.attrs["founded_year"])
    uni_years = [u.attrs["founded_year"] for u in unis]
    firms = sorted(companies, key=lambda c: c.attrs["founded_year"])
    firm_years = [c.attrs["founded_year"] for c in firms]
    for p in people:
        by = p.attrs["birth_year"]
        p.attrs.setdefault("profession", rng.choice(PROFESSIONS))
        k = bisect.bisect_right(uni_years, by + 18)
        if k and rng.random() < 0.65:
            p.attrs["studied_at"] = unis[rng.randrange(k)].id
        if p.attrs["profession"] not in ("musician", "mountaineer") and p.id not in founders:
            k = bisect.bisect_right(firm_years, by + 50)
            if k and rng.random() < 0.75:
                p.attrs["worked_for"] = firms[rng.randrange(k)].id


def _marriages(b: _Builder, people: list[Entity]) -> None:
    """Some neighbours in birth-year order marry (at most 8 years apart)."""
    by_year = sorted(people, key=lambda p: (p.attrs["birth_year"], p.id))
    i = 0
    while i + 1 < len(by_year):
        x, y = by_year[i], by_year[i + 1]
        if b.rng.random() < 0.45 and abs(x.attrs["birth_year"] - y.attrs["birth_year"]) <= 8:
            x.attrs["married_to"], y.attrs["married_to"] = y.id, x.id
            i += 2
        else:
            i += 1


def _generate_entities(seed: int, n_people: int, n_places: int, n_orgs: int) -> dict[str, Entity]:
    """Places first, then people, then what people do: bands, first ascents and companies each take
    people from one shuffled pool (nobody does two of these); studies, jobs and marriages come last."""
    b = _Builder(seed)
    n_countries, n_cities, n_rivers = _split_counts(n_places, (0.10, 0.55, 0.175), 2)
    n_cities = max(n_cities, n_countries)
    n_mountains = max(2, n_places - n_countries - n_cities - n_rivers)
    n_companies, n_universities, n_bands = _split_counts(n_orgs, (0.55, 0.20, 0.25), 1)

    countries = _countries(b, n_countries)
    cities = _cities(b, countries, n_cities)
    mountains = _mountains(b, countries, n_mountains)
    _rivers(b, countries, cities, mountains, n_rivers)
    people = _people(b, cities, n_people)

    pool = people[:]
    b.rng.shuffle(pool)
    _bands(b, pool, cities, n_bands)
    _first_ascents(b, pool, mountains)
    companies = _companies(b, pool, cities, n_companies)
    universities = _universities(b, cities, n_universities)
    _careers(b, people, companies, universities)
    _marriages(b, people)
    return b.ents


# ----------------------------------------------------------------------------- the world
class World:
    """Entities, their facts and the passages that state them.

    Build one with :meth:`generate` or :func:`build_world`; read it with :meth:`corpus`,
    :meth:`passages`, :meth:`get`, :meth:`statements` and :meth:`passages_stating`.
    """

    def __init__(self, seed: int, entities: dict[str, Entity]):
        self.seed = seed
        self.entities = entities
        self._passages: list[Passage] | None = None
        self._by_entity: dict[str, list[Passage]] = {}
        self._statements: dict[tuple[str, str], dict[Any, list[str]]] = {}
        self._doc_entity: dict[str, str] = {}
        self._by_name = {normalize_answer(e.name): e for e in entities.values()}
        self._by_kind: dict[str, list[Entity]] = {}
        self._referrers: dict[tuple[str, str], list[Entity]] = {}
        for e in entities.values():
            self._by_kind.setdefault(e.kind, []).append(e)
            for rel, val in e.attrs.items():
                if rel in ENTITY_RELATIONS:
                    self._referrers.setdefault((rel, val), []).append(e)

    # ------------------------------------------------------------------ generation
    @classmethod
    def generate(cls, seed: int, n_people: int = 150, n_places: int = 80, n_orgs: int = 50) -> "World":
        """Generate a world deterministically from ``seed``.

        ``n_places`` splits into countries (10%), cities (55%), rivers (17.5%) and mountains (rest);
        ``n_orgs`` into companies (55%), universities (20%) and bands (25%).
        """
        if n_people < 4 or n_places < 8 or n_orgs < 4:
            raise ValueError("a world needs n_people >= 4, n_places >= 8 and n_orgs >= 4")
        return cls(seed, _generate_entities(seed, n_people, n_places, n_orgs))

    # ------------------------------------------------------------------ access
    def get(self, entity_id: str) -> Entity:
        return self.entities[entity_id]

    def by_name(self, name: str) -> Entity | None:
        """The entity with this (normalised) name, if any."""
        return self._by_name.get(normalize_answer(name))

    def of_kind(self, kind: str) -> list[Entity]:
        return list(self._by_kind.get(kind, []))

    def referrers(self, relation: str, target_id: str) -> list[Entity]:
        """Entities whose ``relation`` points at ``target_id`` (e.g. the members of a band)."""
        return list(self._referrers.get((relation, target_id), []))

    def name(self, entity_id: str) -> str:
        return self.entities[entity_id].name

    def __len__(self) -> int:
        return len(self.entities)

    def __repr__(self) -> str:
        kinds: dict[str, int] = {}
        for e in self.entities.values():
            kinds[e.kind] = kinds.get(e.kind, 0) + 1
        return f"World(seed={self.seed}, {', '.join(f'{k}={v}' for k, v in kinds.items())})"

    # ------------------------------------------------------------------ corpus
    def passages(self) -> list[Passage]:
        """All passages, rendered once and cached; doc ids are "0", "1", … in corpus order."""
        if self._passages is None:
            self._render()
        assert self._passages is not None
        return self._passages

    def corpus(self) -> list[dict[str, str]]:
        """Search-R1 corpus rows: ``{"id": str, "contents": '"Title"\\ntext'}``."""
        return [p.to_doc() for p in self.passages()]

    def passages_of(self, entity_id: str) -> list[Passage]:
        self.passages()
        return self._by_entity.get(entity_id, [])

    def statements(self, subject: str, relation: str) -> dict[Any, list[str]]:
        """Every value the corpus states for ``(subject, relation)`` → ids of passages stating it."""
        self.passages()
        return self._statements.get((subject, relation), {})

    def passages_stating(self, subject: str, relation: str) -> list[str]:
        """Doc ids stating ``(subject, relation)``, the subject's own passages first."""
        ids = {d for docs in self.statements(subject, relation).values() for d in docs}
        owner = self._doc_entity
        return sorted(ids, key=lambda d: (owner[d] != subject, int(d)))

    def _render(self) -> None:
        """Render the passages and index which passages state which facts."""
        out = render_passages(self)
        self._passages = out
        self._doc_entity = {p.doc_id: p.entity_id for p in out}
        for p in out:
            self._by_entity.setdefault(p.entity_id, []).append(p)
            for subj, rel, val in p.facts:
                docs = self._statements.setdefault((subj, rel), {}).setdefault(val, [])
                if p.doc_id not in docs:
                    docs.append(p.doc_id)


def build_world(seed: int = 0, size: str | int = "small") -> World:
    """A world of a named size (``"tiny"``, ``"small"``, ``"medium"``, ``"large"``) or ``size`` people.

    An integer size scales places and organisations with the number of people (as "medium" does).
    """
    if isinstance(size, str):
        if size not in WORLD_SIZES:
            raise ValueError(f"unknown world size {size!r}; choose one of {sorted(WORLD_SIZES)} or an int")
        n_people, n_places, n_orgs = WORLD_SIZES[size]
    elif isinstance(size, int) and not isinstance(size, bool):
        if size < 4:
            raise ValueError("an integer world size is the number of people and must be >= 4")
        n_people, n_places, n_orgs = size, max(8, round(size * 0.35)), max(4, round(size * 0.3))
    else:
        raise TypeError(f"size must be a str or int, not {type(size).__name__}")
    return World.generate(seed, n_people=n_people, n_places=n_places, n_orgs=n_orgs)
