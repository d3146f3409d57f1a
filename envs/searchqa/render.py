"""Rendering a searchqa world as encyclopedia passages, and the surface forms of its values.

Each entity kind has one renderer: it yields the entity's passages, each a list of
``(sentence, canonical facts the sentence states)``. Recording the facts beside the text is what
lets question generation prove an answer is stated one way only and name its gold passages.
Every entity renders with its own :class:`random.Random` (seeded by world seed and entity id), so
one passage's wording never depends on another's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .lexicon import COLOUR

if TYPE_CHECKING:
    from .world import Entity, World

__all__ = ["Passage", "format_value", "value_answers", "render_passages"]


@dataclass(frozen=True)
class Passage:
    """One corpus document and the canonical facts its text states."""

    doc_id: str
    entity_id: str
    title: str
    text: str
    facts: tuple[tuple[str, str, Any], ...]

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'

    def to_doc(self) -> dict[str, str]:
        return {"id": self.doc_id, "contents": self.contents}


# ----------------------------------------------------------------------------- value formatting
def format_value(relation: str, value: Any) -> str:
    """Surface form of a literal as the corpus writes it (answers[0] uses the same form)."""
    if relation == "population":
        return f"{value:,}"
    if relation == "height_m":
        return f"{value:,} metres"
    if relation == "length_km":
        return f"{value:,} kilometres"
    return str(value)


def value_answers(relation: str, value: Any) -> list[str]:
    """Acceptable answer strings for a literal: the corpus form first, then common variants."""
    first = format_value(relation, value)
    if relation == "population":
        return [first, str(value)]
    if relation == "height_m":
        return [first, f"{value} metres", f"{value:,} m", f"{value} m", f"{value:,}", str(value)]
    if relation == "length_km":
        return [first, f"{value} kilometres", f"{value:,} km", f"{value} km", f"{value:,}", str(value)]
    if "-" in first:  # "synth-pop" normalises to "synthpop"; accept the spaced spelling too
        return [first, first.replace("-", " ")]
    return [first]


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _join(names: list[str]) -> str:
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]



# A renderer yields passages; a passage is a list of (sentence, canonical facts the sentence states).
_Sentences = list[tuple[str, list[tuple[str, str, Any]]]]


#: corpus order of the entity kinds
KIND_ORDER = ("country", "city", "river", "mountain", "person", "company", "university", "band")


def render_passages(world: "World") -> list[Passage]:
    """Every passage of ``world`` in corpus order; doc ids are "0", "1", …; one colour sentence per entity."""
    out: list[Passage] = []
    for kind in KIND_ORDER:
        for e in world.of_kind(kind):
            rng = random.Random(f"agentgym.searchqa.render:{world.seed}:{e.id}")
            for k, sentences in enumerate(_RENDERERS[kind](world, e, rng)):
                if k == 0:
                    he = "She" if e.gender == "f" else "He"
                    sentences.insert(min(2, len(sentences)), (rng.choice(COLOUR[kind]).format(he=he), []))
                text = " ".join(s for s, _ in sentences)
                facts = tuple(f for _, fs in sentences for f in fs)
                out.append(Passage(str(len(out)), e.id, e.name, text, facts))
    return out


def _country(world: "World", e: "Entity", rng: random.Random) -> Iterator[_Sentences]:
    a, n = e.attrs, e.name
    cap = world.name(a["capital"])
    yield [
        (f"{n} is a country with a population of {format_value('population', a['population'])}.",
         [(e.id, "population", a["population"])]),
        (rng.choice((f"Its capital is {cap}.", f"The capital of {n} is {cap}.")),
         [(e.id, "capital", a["capital"]), (a["capital"], "country", e.id)]),
        (f"The official language of {n} is {a['language']}, and its currency is the {a['currency']}.",
         [(e.id, "language", a["language"]), (e.id, "currency", a["currency"])]),
        (rng.choice((f"{n} became an independent state in {a['established_year']}.",
                     f"The state of {n} was established in {a['established_year']}.")),
         [(e.id, "established_year", a["established_year"])]),
    ]
    cities = sorted((c for c in world.referrers("country", e.id) if c.kind == "city"),
                    key=lambda c: -c.attrs["population"])[:6]
    rivers = [r for r in world.referrers("country", e.id) if r.kind == "river"][:4]
    geo: _Sentences = [(f"The largest cities of {n} are {_join([c.name for c in cities])}."
                             if len(cities) > 1 else f"The largest city of {n} is {cities[0].name}.",
                             [(c.id, "country", e.id) for c in cities])]
    if rivers:
        verb = "flows" if len(rivers) == 1 else "flow"
        geo.append((f"The {_join([r.name for r in rivers])} {verb} through {n}.",
                    [(r.id, "country", e.id) for r in rivers]))
    if "highest_mountain" in a:
        m = world.get(a["highest_mountain"])
        h = format_value("height_m", m.attrs["height_m"])
        geo.append((f"The highest mountain in {n} is {m.name}, at {h}.",
                    [(e.id, "highest_mountain", m.id), (m.id, "height_m", m.attrs["height_m"]),
                     (m.id, "country", e.id)]))
    yield geo


def _city(world: "World", e: "Entity", rng: random.Random) -> Iterator[_Sentences]:
    a, n = e.attrs, e.name
    country = world.name(a["country"])
    pop = format_value("population", a["population"])
    s: _Sentences = [
        (rng.choice((f"{n} is a city in {country} with a population of {pop}.",
                     f"{n} is a city in {country}; it has a population of {pop}.")),
         [(e.id, "country", a["country"]), (e.id, "population", a["population"])]),
        (rng.choice((f"It was founded in {a['founded_year']}.", f"The city was founded in {a['founded_year']}.")),
         [(e.id, "founded_year", a["founded_year"])]),
    ]
    if world.get(a["country"]).attrs["capital"] == e.id:
        s.append((f"{n} is the capital of {country}.", [(a["country"], "capital", e.id)]))
    if "on_river" in a:
        s.append((f"{n} lies on the {world.name(a['on_river'])}.", [(e.id, "on_river", a["on_river"])]))
    unis = world.referrers("city", e.id)[:2]
    if unis:
        s.append((f"{n} is home to {_join([u.name for u in unis])}.", [(u.id, "city", e.id) for u in unis]))
    yield s


def _river(world: "World", e: "Entity", rng: random.Random) -> Iterator[_Sentences]:
    a, n = e.attrs, e.name
    length = format_value("length_km", a["length_km"])
    s: _Sentences = [
        (rng.choice((f"The {n} is a river in {world.name(a['country'])}.",
                     f"The {n} is a river that flows through {world.name(a['country'])}.")),
         [(e.id, "country", a["country"])]),
        (f"It is {length} long.", [(e.id, "length_km", a["length_km"])]),
    ]
    if "source" in a:
        s.append((f"The river rises on {world.name(a['source'])}.", [(e.id, "source", a["source"])]))
    towns = world.referrers("on_river", e.id)[:4]
    if towns:
        s.append((f"It flows past {_join([c.name for c in towns])}.",
                  [(c.id, "on_river", e.id) for c in towns]))
    yield s


def _mountain(world: "World", e: "Entity", rng: random.Random) -> Iterator[_Sentences]:
    a, n = e.attrs, e.name
    country = world.name(a["country"])
    h = format_value("height_m", a["height_m"])
    s: _Sentences = [
        (rng.choice((f"{n} is a mountain in {country}, {h} high.",
                     f"{n} is a mountain in {country} with a height of {h}.")),
         [(e.id, "country", a["country"]), (e.id, "height_m", a["height_m"])]),
    ]
    if world.get(a["country"]).attrs.get("highest_mountain") == e.id:
        s.append((f"It is the highest mountain in {country}.", [(a["country"], "highest_mountain", e.id)]))
    if "first_climbed_by" in a:
        s.append((f"It was first climbed in {a['first_ascent_year']} by {world.name(a['first_climbed_by'])}.",
                  [(e.id, "first_ascent_year", a["first_ascent_year"]),
                   (e.id, "first_climbed_by", a["first_climbed_by"])]))
    yield s


def _person(world: "World", e: "Entity", rng: random.Random) -> Iterator[_Sentences]:
    a, n = e.attrs, e.name
    he = "She" if e.gender == "f" else "He"
    prof, year, city = a["profession"], a["birth_year"], world.name(a["born_in"])
    early: _Sentences = [
        (rng.choice((f"{n} is {_article(prof)} {prof} born in {city} in {year}.",
                     f"{n} (born {year}) is {_article(prof)} {prof} from {city}.",
                     f"{n}, born in {year} in {city}, is {_article(prof)} {prof}.")),
         [(e.id, "profession", prof), (e.id, "birth_year", year), (e.id, "born_in", a["born_in"])]),
    ]
    if "studied_at" in a:
        early.append((rng.choice((f"{he} studied at {world.name(a['studied_at'])}.",
                                  f"{he} is a graduate of {world.name(a['studied_at'])}.")),
                      [(e.id, "studied_at", a["studied_at"])]))
    career: _Sentences = []
    if "worked_for" in a:
        career.append((f"{n} worked as {_article(prof)} {prof} for {world.name(a['worked_for'])}.",
                       [(e.id, "worked_for", a["worked_for"]), (e.id, "profession", prof)]))
    for c in world.referrers("founder", e.id):
        career.append((f"In {c.attrs['founded_year']}, {n} founded {c.name}.",
                       [(c.id, "founder", e.id), (c.id, "founded_year", c.attrs["founded_year"])]))
    if "member_of" in a:
        career.append((f"{n} is a member of the band {world.name(a['member_of'])}.",
                       [(e.id, "member_of", a["member_of"])]))
    for m in world.referrers("first_climbed_by", e.id):
        career.append((f"In {m.attrs['first_ascent_year']}, {n} became the first person to climb {m.name}.",
                       [(m.id, "first_climbed_by", e.id),
                        (m.id, "first_ascent_year", m.attrs["first_ascent_year"])]))
    if "married_to" in a:
        sp = a["married_to"]
        career.append((f"{n} is married to {world.name(sp)}.", [(e.id, "married_to", sp), (sp, "married_to", e.id)]))
    # People with a long story get two passages, as an encyclopedia splits long articles.
    if len(career) >= 2:
        yield early
        yield career
    else:
        yield early + career


def _company(world: "World", e: "Entity", rng: random.Random) -> Iterator[_Sentences]:
    a, n = e.attrs, e.name
    ind = a["industry"]
    yield [
        (f"{n} is {_article(ind)} {ind} company founded in {a['founded_year']} by {world.name(a['founder'])}.",
         [(e.id, "industry", ind), (e.id, "founded_year", a["founded_year"]), (e.id, "founder", a["founder"])]),
        (rng.choice((f"It is headquartered in {world.name(a['headquarters'])}.",
                     f"The company has its headquarters in {world.name(a['headquarters'])}.")),
         [(e.id, "headquarters", a["headquarters"])]),
    ]


def _university(world: "World", e: "Entity", rng: random.Random) -> Iterator[_Sentences]:
    a, n = e.attrs, e.name
    s: _Sentences = [
        (rng.choice((f"{n} is a university in {world.name(a['city'])}, founded in {a['founded_year']}.",
                     f"{n} is a university located in {world.name(a['city'])}. It was founded in {a['founded_year']}.")),
         [(e.id, "city", a["city"]), (e.id, "founded_year", a["founded_year"])]),
    ]
    alumni = world.referrers("studied_at", e.id)[:3]
    if alumni:
        s.append((f"Its alumni include {_join([p.name for p in alumni])}.",
                  [(p.id, "studied_at", e.id) for p in alumni]))
    yield s


def _band(world: "World", e: "Entity", rng: random.Random) -> Iterator[_Sentences]:
    a, n = e.attrs, e.name
    g = a["genre"]
    members = world.referrers("member_of", e.id)
    yield [
        (f"{n} is {_article(g)} {g} band formed in {world.name(a['origin'])} in {a['formed_year']}.",
         [(e.id, "genre", g), (e.id, "origin", a["origin"]), (e.id, "formed_year", a["formed_year"])]),
        (f"The band's members are {_join([p.name for p in members])}.",
         [(p.id, "member_of", e.id) for p in members]),
    ]


_RENDERERS: dict[str, Callable[["World", "Entity", random.Random], Iterator[_Sentences]]] = {
    "country": _country,
    "city": _city,
    "river": _river,
    "mountain": _mountain,
    "person": _person,
    "company": _company,
    "university": _university,
    "band": _band,
}
