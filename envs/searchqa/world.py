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
"""

from __future__ import annotations

import bisect
import random
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from agentgym.rewards import normalize_answer

__all__ = [
    "World", "Entity", "Passage", "build_world", "WORLD_SIZES", "ENTITY_RELATIONS", "format_value",
    "value_answers",
]

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

_PROFESSIONS = (
    "engineer", "geologist", "architect", "chemist", "physician", "historian", "journalist",
    "economist", "botanist", "painter", "novelist", "mathematician", "lawyer", "pilot", "teacher",
    "photographer", "astronomer", "chef", "sculptor", "linguist", "pharmacist", "cartographer",
)
_INDUSTRIES = (
    "software", "shipbuilding", "textile", "pharmaceutical", "mining", "aviation", "publishing",
    "telecommunications", "food processing", "robotics", "banking", "furniture", "glassmaking",
    "solar energy", "logistics", "toy", "chocolate", "bicycle",
)
_GENRES = (
    "jazz", "folk", "punk rock", "synth-pop", "heavy metal", "bluegrass", "reggae", "indie rock",
    "soul", "ambient", "hip hop", "ska", "baroque pop", "grunge", "surf rock", "gospel",
)
# Fact-free "colour" sentences: they make passages read like encyclopedia text and give retrievers
# realistic lexical noise, while stating nothing a question could ask about.
_COLOUR = {
    "country": ("Much of its territory is covered by forest and rolling hills.",
                "The country is divided into provinces, each with its own elected council.",
                "Its economy rests on farming, trade and a growing service sector.",
                "Its coastline is dotted with fishing villages and small harbours."),
    "city": ("The old town is known for its covered markets and narrow stone streets.",
             "A tram network links the centre with the outer districts.",
             "Every autumn the city hosts a lantern festival.",
             "The city is an important hub for regional trade."),
    "river": ("Its valley is used mostly for farming.",
              "Small boats can navigate part of its course.",
              "Its banks are lined with willow and alder trees."),
    "mountain": ("Its upper slopes are covered by snow for most of the year.",
                 "Several hiking trails lead towards its summit.",
                 "The mountain is a popular destination for climbers."),
    "person": ("{he} is known for a careful, methodical style of work.",
               "{he} has given many public lectures.",
               "{he} is often described as modest and private."),
    "company": ("The company employs several thousand people.",
                "It exports most of its products.",
                "The company is known for its long-term research programmes."),
    "university": ("It is known for its large library and botanical garden.",
                   "The university offers programmes in the sciences and humanities."),
    "band": ("The band is known for its energetic live shows.",
             "Its songs often deal with travel and the sea."),
}
_COMPANY_SUFFIXES = ("Industries", "Works", "Systems", "Group", "Labs", "Holdings", "Dynamics", "Foundry")
_UNIVERSITY_PATTERNS = ("{w} University", "{w} State University", "{w} Institute of Technology", "{w} College")
_BAND_PATTERNS = ("{w}", "The {w} Lanterns", "{w} Parade", "{w} Collective", "The {w} Echoes", "{w} Static")

# Well-known real names a syllable generator could plausibly produce; rejected outright.
_REAL_NAMES = frozenset("""
paris rome roma milan lima cuba peru chad togo laos oman mali nepal kenya ghana china japan india
iran iraq qatar yemen samoa tonga fiji malta italy spain sudan niger benin gabon congo libya syria
tokyo osaka kyoto seoul dubai doha baku riga sofia kiev kyiv minsk oslo bern vaduz berlin bonn
hanoi quito sucre apia suva male accra dakar lagos kabul delhi dhaka tunis rabat cairo lusaka
harare maputo luanda nairobi kigali juba sana aden muscat manama amman beirut damascus ankara
athens madrid lisbon london dublin boston denver dallas austin tampa miami reno salem helena
toledo sparta troy nile amazon volga danube rhine seine thames indus ganges tigris everest denali
elbrus kilimanjaro etna fuji tesla nokia sony honda toyota nike adidas samsung apple google amazon
intel oracle cisco yale harvard oxford cambridge stanford berkeley princeton abba queen kiss toto
asia africa europe tetris tustin lego ikea maria anna elena sara laura mara nora lena tina dora vera zara rosa olga
""".split())

# Syllable inventory, weighted towards simple consonant-vowel syllables so names stay readable.
_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "b", "d", "k", "l",
           "m", "n", "r", "s", "t", "v", "br", "dr", "kr", "st", "tr", "th", "sh", "ch", "j", "w")
_NUCLEI = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "a", "e", "o", "ae", "ei", "ou", "ia")
_CODAS = ("", "", "", "", "", "", "n", "r", "l", "s", "m", "k", "th", "nd", "x")
_BAD_CLUSTER = re.compile(r"[aeiou]{3}|[^aeiou]{3}|(.)\1|^[^aeiou]*$")


class NameForge:
    """Invents pronounceable words that are unique within one world."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _candidate(self, min_syl: int, max_syl: int) -> str:
        r = self.rng
        parts = []
        for i in range(r.randint(min_syl, max_syl)):
            onset = "" if (i == 0 and r.random() < 0.15) else r.choice(_ONSETS)
            coda = r.choice(_CODAS) if (i == 0 or r.random() < 0.5) else ""
            parts.append(onset + r.choice(_NUCLEI) + coda)
        return "".join(parts)

    def word(self, min_syl: int = 2, max_syl: int = 3, reserve: bool = True) -> str:
        """A fresh capitalised word: 4–9 letters, not real, not used before in this world."""
        for _ in range(10_000):
            w = self._candidate(min_syl, max_syl)
            if not (4 <= len(w) <= 9) or _BAD_CLUSTER.search(w) or w in _REAL_NAMES or w in self.used:
                continue
            if reserve:
                self.used.add(w)
            return w.capitalize()
        raise RuntimeError("name space exhausted; the world is too large for the syllable inventory")

    def claim(self, name: str) -> bool:
        """Reserve a multi-word name (normalised); False if it is taken."""
        key = normalize_answer(name)
        if key in self.used:
            return False
        self.used.add(key)
        return True


@dataclass(eq=False)
class Entity:
    """One thing in the world; ``attrs`` maps relation → value (entity id or literal)."""

    id: str
    kind: str
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)
    gender: str | None = None  # people only: "f" or "m", for pronouns


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


# A renderer yields passages; a passage is a list of (sentence, canonical facts the sentence states).
_Sentences = list[tuple[str, list[tuple[str, str, Any]]]]


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
        rng = random.Random(f"agentgym.searchqa.world:{seed}")
        forge = NameForge(random.Random(f"agentgym.searchqa.names:{seed}"))
        ents: dict[str, Entity] = {}

        counts: dict[str, int] = {}

        def add(kind: str, name: str, **attrs: Any) -> Entity:
            counts[kind] = counts.get(kind, 0) + 1
            e = Entity(id=f"{kind}:{counts[kind] - 1}", kind=kind, name=name, attrs=dict(attrs))
            ents[e.id] = e
            return e

        n_countries, n_cities, n_rivers = _split_counts(n_places, (0.10, 0.55, 0.175), 2)
        n_cities = max(n_cities, n_countries)
        n_mountains = max(2, n_places - n_countries - n_cities - n_rivers)
        n_companies, n_universities, n_bands = _split_counts(n_orgs, (0.55, 0.20, 0.25), 1)

        # Countries and their cities.
        countries = []
        for _ in range(n_countries):
            c = add("country", forge.word(2, 3), established_year=rng.randint(1300, 1975),
                    language=forge.word(2, 3) + rng.choice(("ic", "ish", "ese", "ian", "i")),
                    currency=forge.word(2, 2).lower())
            forge.claim(c.attrs["language"]); forge.claim(c.attrs["currency"])
            countries.append(c)
        cities = []
        for i in range(n_cities):
            country = countries[i] if i < n_countries else rng.choice(countries)
            cities.append(add("city", forge.word(2, 3), country=country.id,
                              population=rng.randint(8, 4000) * 1000 + rng.randint(0, 999),
                              founded_year=rng.randint(700, 1850)))
        cities_in: dict[str, list[Entity]] = {}
        for c in cities:
            cities_in.setdefault(c.attrs["country"], []).append(c)
        for country in countries:
            own = cities_in[country.id]
            capital = max(own, key=lambda c: c.attrs["population"])
            country.attrs["capital"] = capital.id
            total = sum(c.attrs["population"] for c in own)
            country.attrs["population"] = int(total * rng.uniform(1.5, 4.0)) // 1000 * 1000

        # Mountains (distinct heights, so "highest" is unambiguous) and rivers.
        heights = rng.sample(range(900, 8200), n_mountains)
        mountains = []
        for h in heights:
            name = f"Mount {forge.word(2, 3)}"
            forge.claim(name)
            mountains.append(add("mountain", name, country=rng.choice(countries).id, height_m=h))
        mountains_in: dict[str, list[Entity]] = {}
        for m in mountains:
            mountains_in.setdefault(m.attrs["country"], []).append(m)
        for country in countries:
            own = mountains_in.get(country.id, [])
            if own:
                country.attrs["highest_mountain"] = max(own, key=lambda m: m.attrs["height_m"]).id
        rivers = []
        for _ in range(n_rivers):
            name = f"{forge.word(2, 3)} River"
            forge.claim(name)
            country = rng.choice(countries)
            r = add("river", name, country=country.id, length_km=rng.randint(40, 3500))
            own = mountains_in.get(country.id, [])
            if own and rng.random() < 0.7:
                r.attrs["source"] = rng.choice(own).id
            rivers.append(r)
        rivers_in: dict[str, list[Entity]] = {}
        for r in rivers:
            rivers_in.setdefault(r.attrs["country"], []).append(r)
        for city in cities:
            own = rivers_in.get(city.attrs["country"], [])
            if own and rng.random() < 0.5:
                city.attrs["on_river"] = rng.choice(own).id

        # People: a shared pool of given names and surnames; full names unique.
        first_pool = [forge.word(2, 3) for _ in range(max(24, n_people // 3))]
        last_pool = [forge.word(2, 3) for _ in range(max(32, n_people // 2))]
        people = []
        for _ in range(n_people):
            while True:
                name = f"{rng.choice(first_pool)} {rng.choice(last_pool)}"
                if forge.claim(name):
                    break
            p = add("person", name, birth_year=rng.randint(1930, 2002), born_in=rng.choice(cities).id)
            p.gender = rng.choice("fm")
            people.append(p)

        pool = people[:]
        rng.shuffle(pool)
        # Bands take musicians; first ascents and companies take others; nobody does two of these.
        bands = []
        for _ in range(n_bands):
            size = rng.randint(2, 4)
            if len(pool) < size + 2:
                break
            members = [pool.pop() for _ in range(size)]
            while True:
                name = rng.choice(_BAND_PATTERNS).format(w=forge.word(2, 3))
                if forge.claim(name):
                    break
            b = add("band", name, genre=rng.choice(_GENRES), origin=rng.choice(cities).id,
                    formed_year=_later(rng, max(m.attrs["birth_year"] for m in members), 16, 24))
            for m in members:
                m.attrs["profession"] = "musician"
                m.attrs["member_of"] = b.id
            bands.append(b)
        for m in mountains:
            climber = _take(pool, born_by=_PRESENT - 20)
            if climber is not None and rng.random() < 0.8:
                climber.attrs["profession"] = "mountaineer"
                m.attrs["first_climbed_by"] = climber.id
                m.attrs["first_ascent_year"] = _later(rng, climber.attrs["birth_year"], 20, 40)
        companies = []
        for _ in range(n_companies):
            founder = _take(pool, born_by=_PRESENT - 24)
            if founder is None:
                break
            name = f"{forge.word(2, 3)} {rng.choice(_COMPANY_SUFFIXES)}"
            forge.claim(name)
            companies.append(add("company", name, founder=founder.id, industry=rng.choice(_INDUSTRIES),
                                 headquarters=rng.choice(cities).id,
                                 founded_year=_later(rng, founder.attrs["birth_year"], 24, 50)))
        universities = []
        for _ in range(n_universities):
            while True:
                name = rng.choice(_UNIVERSITY_PATTERNS).format(w=forge.word(2, 3))
                if forge.claim(name):
                    break
            city = rng.choice(cities)
            universities.append(add("university", name, city=city.id,
                                    founded_year=rng.randint(max(1400, city.attrs["founded_year"] + 30), 1965)))

        # Studies and jobs only at institutions that existed by then (sorted + bisect keeps it linear).
        founders = {c.attrs["founder"] for c in companies}
        unis = sorted(universities, key=lambda u: u.attrs["founded_year"])
        uni_years = [u.attrs["founded_year"] for u in unis]
        firms = sorted(companies, key=lambda c: c.attrs["founded_year"])
        firm_years = [c.attrs["founded_year"] for c in firms]
        for p in people:
            by = p.attrs["birth_year"]
            p.attrs.setdefault("profession", rng.choice(_PROFESSIONS))
            k = bisect.bisect_right(uni_years, by + 18)
            if k and rng.random() < 0.65:
                p.attrs["studied_at"] = unis[rng.randrange(k)].id
            if p.attrs["profession"] not in ("musician", "mountaineer") and p.id not in founders:
                k = bisect.bisect_right(firm_years, by + 50)
                if k and rng.random() < 0.75:
                    p.attrs["worked_for"] = firms[rng.randrange(k)].id
        # Marriages: neighbours in birth-year order, some of them.
        by_year = sorted(people, key=lambda p: (p.attrs["birth_year"], p.id))
        i = 0
        while i + 1 < len(by_year):
            a, b = by_year[i], by_year[i + 1]
            if rng.random() < 0.45 and abs(a.attrs["birth_year"] - b.attrs["birth_year"]) <= 8:
                a.attrs["married_to"], b.attrs["married_to"] = b.id, a.id
                i += 2
            else:
                i += 1
        return cls(seed, ents)

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
        out: list[Passage] = []
        order = ("country", "city", "river", "mountain", "person", "company", "university", "band")
        for kind in order:
            for e in self._by_kind.get(kind, []):
                rng = random.Random(f"agentgym.searchqa.render:{self.seed}:{e.id}")
                for k, sentences in enumerate(getattr(self, f"_render_{kind}")(e, rng)):
                    if k == 0:
                        he = "She" if e.gender == "f" else "He"
                        sentences.insert(min(2, len(sentences)), (rng.choice(_COLOUR[kind]).format(he=he), []))
                    text = " ".join(s for s, _ in sentences)
                    facts = tuple(f for _, fs in sentences for f in fs)
                    out.append(Passage(str(len(out)), e.id, e.name, text, facts))
        self._passages = out
        self._doc_entity = {p.doc_id: p.entity_id for p in out}
        for p in out:
            self._by_entity.setdefault(p.entity_id, []).append(p)
            for subj, rel, val in p.facts:
                docs = self._statements.setdefault((subj, rel), {}).setdefault(val, [])
                if p.doc_id not in docs:
                    docs.append(p.doc_id)

    def _render_country(self, e: Entity, rng: random.Random) -> Iterator[_Sentences]:
        a, n = e.attrs, e.name
        cap = self.name(a["capital"])
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
        cities = sorted((c for c in self.referrers("country", e.id) if c.kind == "city"),
                        key=lambda c: -c.attrs["population"])[:6]
        rivers = [r for r in self.referrers("country", e.id) if r.kind == "river"][:4]
        geo: _Sentences = [(f"The largest cities of {n} are {_join([c.name for c in cities])}."
                                 if len(cities) > 1 else f"The largest city of {n} is {cities[0].name}.",
                                 [(c.id, "country", e.id) for c in cities])]
        if rivers:
            verb = "flows" if len(rivers) == 1 else "flow"
            geo.append((f"The {_join([r.name for r in rivers])} {verb} through {n}.",
                        [(r.id, "country", e.id) for r in rivers]))
        if "highest_mountain" in a:
            m = self.get(a["highest_mountain"])
            h = format_value("height_m", m.attrs["height_m"])
            geo.append((f"The highest mountain in {n} is {m.name}, at {h}.",
                        [(e.id, "highest_mountain", m.id), (m.id, "height_m", m.attrs["height_m"]),
                         (m.id, "country", e.id)]))
        yield geo

    def _render_city(self, e: Entity, rng: random.Random) -> Iterator[_Sentences]:
        a, n = e.attrs, e.name
        country = self.name(a["country"])
        pop = format_value("population", a["population"])
        s: _Sentences = [
            (rng.choice((f"{n} is a city in {country} with a population of {pop}.",
                         f"{n} is a city in {country}; it has a population of {pop}.")),
             [(e.id, "country", a["country"]), (e.id, "population", a["population"])]),
            (rng.choice((f"It was founded in {a['founded_year']}.", f"The city was founded in {a['founded_year']}.")),
             [(e.id, "founded_year", a["founded_year"])]),
        ]
        if self.get(a["country"]).attrs["capital"] == e.id:
            s.append((f"{n} is the capital of {country}.", [(a["country"], "capital", e.id)]))
        if "on_river" in a:
            s.append((f"{n} lies on the {self.name(a['on_river'])}.", [(e.id, "on_river", a["on_river"])]))
        unis = self.referrers("city", e.id)[:2]
        if unis:
            s.append((f"{n} is home to {_join([u.name for u in unis])}.", [(u.id, "city", e.id) for u in unis]))
        yield s

    def _render_river(self, e: Entity, rng: random.Random) -> Iterator[_Sentences]:
        a, n = e.attrs, e.name
        length = format_value("length_km", a["length_km"])
        s: _Sentences = [
            (rng.choice((f"The {n} is a river in {self.name(a['country'])}.",
                         f"The {n} is a river that flows through {self.name(a['country'])}.")),
             [(e.id, "country", a["country"])]),
            (f"It is {length} long.", [(e.id, "length_km", a["length_km"])]),
        ]
        if "source" in a:
            s.append((f"The river rises on {self.name(a['source'])}.", [(e.id, "source", a["source"])]))
        towns = self.referrers("on_river", e.id)[:4]
        if towns:
            s.append((f"It flows past {_join([c.name for c in towns])}.",
                      [(c.id, "on_river", e.id) for c in towns]))
        yield s

    def _render_mountain(self, e: Entity, rng: random.Random) -> Iterator[_Sentences]:
        a, n = e.attrs, e.name
        country = self.name(a["country"])
        h = format_value("height_m", a["height_m"])
        s: _Sentences = [
            (rng.choice((f"{n} is a mountain in {country}, {h} high.",
                         f"{n} is a mountain in {country} with a height of {h}.")),
             [(e.id, "country", a["country"]), (e.id, "height_m", a["height_m"])]),
        ]
        if self.get(a["country"]).attrs.get("highest_mountain") == e.id:
            s.append((f"It is the highest mountain in {country}.", [(a["country"], "highest_mountain", e.id)]))
        if "first_climbed_by" in a:
            s.append((f"It was first climbed in {a['first_ascent_year']} by {self.name(a['first_climbed_by'])}.",
                      [(e.id, "first_ascent_year", a["first_ascent_year"]),
                       (e.id, "first_climbed_by", a["first_climbed_by"])]))
        yield s

    def _render_person(self, e: Entity, rng: random.Random) -> Iterator[_Sentences]:
        a, n = e.attrs, e.name
        he = "She" if e.gender == "f" else "He"
        prof, year, city = a["profession"], a["birth_year"], self.name(a["born_in"])
        early: _Sentences = [
            (rng.choice((f"{n} is {_article(prof)} {prof} born in {city} in {year}.",
                         f"{n} (born {year}) is {_article(prof)} {prof} from {city}.",
                         f"{n}, born in {year} in {city}, is {_article(prof)} {prof}.")),
             [(e.id, "profession", prof), (e.id, "birth_year", year), (e.id, "born_in", a["born_in"])]),
        ]
        if "studied_at" in a:
            early.append((rng.choice((f"{he} studied at {self.name(a['studied_at'])}.",
                                      f"{he} is a graduate of {self.name(a['studied_at'])}.")),
                          [(e.id, "studied_at", a["studied_at"])]))
        career: _Sentences = []
        if "worked_for" in a:
            career.append((f"{n} worked as {_article(prof)} {prof} for {self.name(a['worked_for'])}.",
                           [(e.id, "worked_for", a["worked_for"]), (e.id, "profession", prof)]))
        for c in self.referrers("founder", e.id):
            career.append((f"In {c.attrs['founded_year']}, {n} founded {c.name}.",
                           [(c.id, "founder", e.id), (c.id, "founded_year", c.attrs["founded_year"])]))
        if "member_of" in a:
            career.append((f"{n} is a member of the band {self.name(a['member_of'])}.",
                           [(e.id, "member_of", a["member_of"])]))
        for m in self.referrers("first_climbed_by", e.id):
            career.append((f"In {m.attrs['first_ascent_year']}, {n} became the first person to climb {m.name}.",
                           [(m.id, "first_climbed_by", e.id),
                            (m.id, "first_ascent_year", m.attrs["first_ascent_year"])]))
        if "married_to" in a:
            sp = a["married_to"]
            career.append((f"{n} is married to {self.name(sp)}.", [(e.id, "married_to", sp), (sp, "married_to", e.id)]))
        # People with a long story get two passages, as an encyclopedia splits long articles.
        if len(career) >= 2:
            yield early
            yield career
        else:
            yield early + career

    def _render_company(self, e: Entity, rng: random.Random) -> Iterator[_Sentences]:
        a, n = e.attrs, e.name
        ind = a["industry"]
        yield [
            (f"{n} is {_article(ind)} {ind} company founded in {a['founded_year']} by {self.name(a['founder'])}.",
             [(e.id, "industry", ind), (e.id, "founded_year", a["founded_year"]), (e.id, "founder", a["founder"])]),
            (rng.choice((f"It is headquartered in {self.name(a['headquarters'])}.",
                         f"The company has its headquarters in {self.name(a['headquarters'])}.")),
             [(e.id, "headquarters", a["headquarters"])]),
        ]

    def _render_university(self, e: Entity, rng: random.Random) -> Iterator[_Sentences]:
        a, n = e.attrs, e.name
        s: _Sentences = [
            (rng.choice((f"{n} is a university in {self.name(a['city'])}, founded in {a['founded_year']}.",
                         f"{n} is a university located in {self.name(a['city'])}. It was founded in {a['founded_year']}.")),
             [(e.id, "city", a["city"]), (e.id, "founded_year", a["founded_year"])]),
        ]
        alumni = self.referrers("studied_at", e.id)[:3]
        if alumni:
            s.append((f"Its alumni include {_join([p.name for p in alumni])}.",
                      [(p.id, "studied_at", e.id) for p in alumni]))
        yield s

    def _render_band(self, e: Entity, rng: random.Random) -> Iterator[_Sentences]:
        a, n = e.attrs, e.name
        g = a["genre"]
        members = self.referrers("member_of", e.id)
        yield [
            (f"{n} is {_article(g)} {g} band formed in {self.name(a['origin'])} in {a['formed_year']}.",
             [(e.id, "genre", g), (e.id, "origin", a["origin"]), (e.id, "formed_year", a["formed_year"])]),
            (f"The band's members are {_join([p.name for p in members])}.",
             [(p.id, "member_of", e.id) for p in members]),
        ]


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
