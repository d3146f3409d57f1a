"""Questions about a :class:`~agentgym.envs.searchqa.world.World`, with gold answers and passages.

Three types, so that *whether* to search is part of what a policy learns:

- ``single_hop``: one fact of one entity ("In which city was X born?"); the gold passage is the
  entity's own passage that states it.
- ``multi_hop``: two facts chained through a bridge entity that the question does not name
  ("In which country is the city where X was born?"); gold passages = one per hop, in order.
- ``no_search``: answerable from the question alone (arithmetic, word puzzles); searching the
  corpus cannot help and only costs turns.

Guarantees checked while generating (a candidate failing one is dropped, never asked):

- every hop's fact is stated with exactly one value across the whole corpus (so no passage
  contradicts the gold answer), and the answer's surface form appears in the last gold passage;
- a multi-hop answer appears in none of the subject's own passages, and the two hops come from
  different passages, so one retrieval of the subject cannot answer it.

The splits ``train``, ``validation`` and ``test`` are disjoint by *subject entity*: each entity is
assigned to one split by a hash of (world seed, entity id) (test the first quarter of the hash range,
as before validation existed, validation the next 15 %), so no held-out question asks about an entity
a train question starts from. No-search questions are split by a hash of their text. A question text
that two entities share (namesakes) is ambiguous and never asked, so no text is in two splits or twice
in one. Sampling is deterministic in ``(world, n, seed, split, mix)``.
"""

from __future__ import annotations

import hashlib
import random
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

from agentgym.rewards import normalize_answer
from agentgym.splits import SPLITS, check_split, normalise_task_text
from agentgym.envs.searchqa.world import ENTITY_RELATIONS, World
from agentgym.envs.searchqa.render import value_answers

__all__ = [
    "make_questions", "question_pool_sizes", "entity_split", "QUESTION_TYPES", "DEFAULT_MIX", "SINGLE_HOP_TEMPLATES",
    "MULTI_HOP_TEMPLATES", "NO_SEARCH_KINDS",
]

QUESTION_TYPES = ("single_hop", "multi_hop", "no_search")
DEFAULT_MIX: dict[str, float] = {"single_hop": 0.4, "multi_hop": 0.4, "no_search": 0.2}
VALIDATION_FRACTION = 0.15  # share of entities (and no-search texts) in the validation split


@dataclass(frozen=True)
class Template:
    """A question pattern: start at an entity of ``kind`` and follow ``path`` (1 or 2 relations)."""

    name: str
    kind: str
    path: tuple[str, ...]
    text: str  # formatted with s = the subject's name


def _t(name: str, kind: str, path: str, text: str) -> Template:
    return Template(name, kind, tuple(path.split(".")), text)


SINGLE_HOP_TEMPLATES: tuple[Template, ...] = (
    _t("person_birth_year", "person", "birth_year", "In what year was {s} born?"),
    _t("person_born_in", "person", "born_in", "In which city was {s} born?"),
    _t("person_profession", "person", "profession", "What is the profession of {s}?"),
    _t("person_studied_at", "person", "studied_at", "Which university did {s} attend?"),
    _t("person_worked_for", "person", "worked_for", "Which company did {s} work for?"),
    _t("person_married_to", "person", "married_to", "Who is {s} married to?"),
    _t("person_member_of", "person", "member_of", "Which band is {s} a member of?"),
    _t("city_country", "city", "country", "In which country is the city of {s}?"),
    _t("city_population", "city", "population", "What is the population of the city of {s}?"),
    _t("city_founded", "city", "founded_year", "In what year was the city of {s} founded?"),
    _t("city_river", "city", "on_river", "Which river does the city of {s} lie on?"),
    _t("country_capital", "country", "capital", "What is the capital of {s}?"),
    _t("country_language", "country", "language", "What is the official language of {s}?"),
    _t("country_currency", "country", "currency", "What is the currency of {s}?"),
    _t("country_established", "country", "established_year", "In what year did {s} become an independent state?"),
    _t("country_highest", "country", "highest_mountain", "What is the highest mountain in {s}?"),
    _t("country_population", "country", "population", "What is the population of the country {s}?"),
    _t("river_country", "river", "country", "Which country does the {s} flow through?"),
    _t("river_length", "river", "length_km", "How long is the {s}?"),
    _t("river_source", "river", "source", "On which mountain does the {s} rise?"),
    _t("mountain_country", "mountain", "country", "In which country is {s}?"),
    _t("mountain_height", "mountain", "height_m", "How high is {s}?"),
    _t("mountain_climber", "mountain", "first_climbed_by", "Who was the first person to climb {s}?"),
    _t("mountain_ascent", "mountain", "first_ascent_year", "In what year was {s} first climbed?"),
    _t("company_founded", "company", "founded_year", "In what year was {s} founded?"),
    _t("company_founder", "company", "founder", "Who founded {s}?"),
    _t("company_hq", "company", "headquarters", "In which city is {s} headquartered?"),
    _t("company_industry", "company", "industry", "In which industry does {s} operate?"),
    _t("university_founded", "university", "founded_year", "In what year was {s} founded?"),
    _t("university_city", "university", "city", "In which city is {s} located?"),
    _t("band_genre", "band", "genre", "What genre of music does {s} play?"),
    _t("band_formed", "band", "formed_year", "In what year was the band {s} formed?"),
    _t("band_origin", "band", "origin", "In which city was the band {s} formed?"),
)

MULTI_HOP_TEMPLATES: tuple[Template, ...] = (
    _t("person_birth_country", "person", "born_in.country", "In which country is the city where {s} was born?"),
    _t("person_birthplace_founded", "person", "born_in.founded_year",
       "In what year was the city where {s} was born founded?"),
    _t("person_employer_founder", "person", "worked_for.founder", "Who founded the company that {s} worked for?"),
    _t("person_employer_hq", "person", "worked_for.headquarters",
       "In which city is the company that {s} worked for headquartered?"),
    _t("person_university_founded", "person", "studied_at.founded_year",
       "In what year was the university that {s} attended founded?"),
    _t("person_university_city", "person", "studied_at.city", "In which city is the university that {s} attended?"),
    _t("person_spouse_birth_year", "person", "married_to.birth_year", "In what year was the spouse of {s} born?"),
    _t("person_spouse_profession", "person", "married_to.profession",
       "What is the profession of the person {s} is married to?"),
    _t("person_band_genre", "person", "member_of.genre",
       "What genre of music does the band that {s} is a member of play?"),
    _t("company_founder_born_in", "company", "founder.born_in", "In which city was the founder of {s} born?"),
    _t("company_founder_birth_year", "company", "founder.birth_year", "In what year was the founder of {s} born?"),
    _t("company_hq_country", "company", "headquarters.country",
       "In which country is the city where {s} is headquartered?"),
    _t("university_country", "university", "city.country", "In which country is the city where {s} is located?"),
    _t("band_origin_country", "band", "origin.country", "In which country is the city where {s} was formed?"),
    _t("mountain_climber_birth_year", "mountain", "first_climbed_by.birth_year",
       "In what year was the first person to climb {s} born?"),
    _t("mountain_country_capital", "mountain", "country.capital",
       "What is the capital of the country where {s} is located?"),
    _t("river_country_capital", "river", "country.capital",
       "What is the capital of the country that the {s} flows through?"),
    _t("river_source_height", "river", "source.height_m", "How high is the mountain on which the {s} rises?"),
    _t("city_country_language", "city", "country.language",
       "What is the official language of the country where {s} is located?"),
    _t("city_country_currency", "city", "country.currency",
       "What is the currency of the country where the city of {s} is located?"),
)


# ----------------------------------------------------------------------------- helpers
def _unit_hash(*parts: Any) -> float:
    """A stable number in [0, 1) (Python's hash() is salted per process, so it cannot be used)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _band(u: float, test_fraction: float, validation_fraction: float) -> str:
    return "test" if u < test_fraction else "validation" if u < test_fraction + validation_fraction else "train"


def entity_split(world: World, entity_id: str, test_fraction: float = 0.25,
                 validation_fraction: float = VALIDATION_FRACTION) -> str:
    """The split an entity's questions belong to (fixed for a world, independent of sampling seed)."""
    return _band(_unit_hash("entity", world.seed, entity_id), test_fraction, validation_fraction)


def _text_split(text: str, test_fraction: float, validation_fraction: float = VALIDATION_FRACTION) -> str:
    return _band(_unit_hash("text", text), test_fraction, validation_fraction)


def _entity_answers(world: World, entity_id: str) -> list[str]:
    name = world.name(entity_id)
    kind = world.get(entity_id).kind
    if kind == "river" and name.endswith(" River"):
        return [name, name[: -len(" River")]]
    if kind == "mountain" and name.startswith("Mount "):
        return [name, name[len("Mount "):]]
    return [name]


def _answers(world: World, relation: str, value: Any) -> list[str]:
    return _entity_answers(world, value) if relation in ENTITY_RELATIONS else value_answers(relation, value)


def _unique_value(world: World, subject: str, relation: str) -> tuple[bool, Any]:
    stated = world.statements(subject, relation)
    if len(stated) != 1:
        return False, None
    return True, next(iter(stated))


def _passage_by_id(world: World) -> dict[str, str]:
    return {p.doc_id: p.contents for p in world.passages()}


# ----------------------------------------------------------------------------- candidates
def _candidates(world: World, test_fraction: float) -> dict[str, dict[str, dict[str, list[dict]]]]:
    """split → type → template name → candidate question rows (every valid one in the world)."""
    contents = _passage_by_id(world)
    norm_contents = {d: f" {normalize_answer(c)} " for d, c in contents.items()}
    pools: dict[str, dict[str, dict[str, list[dict]]]] = {
        s: {"single_hop": {}, "multi_hop": {}} for s in SPLITS}
    split_of = {e: entity_split(world, e, test_fraction) for e in world.entities}
    rows: list[tuple[str, str, str, dict]] = []
    for qtype, templates in (("single_hop", SINGLE_HOP_TEMPLATES), ("multi_hop", MULTI_HOP_TEMPLATES)):
        for tpl in templates:
            for subject in world.of_kind(tpl.kind):
                row = _instantiate(world, tpl, subject.id, contents, norm_contents)
                if row is not None:
                    rows.append((split_of[subject.id], qtype, tpl.name, {**row, "type": qtype}))
    texts: dict[str, int] = {}
    for *_, row in rows:
        key = normalise_task_text(row["question"])
        texts[key] = texts.get(key, 0) + 1
    for split, qtype, name, row in rows:
        if texts[normalise_task_text(row["question"])] == 1:  # namesakes: ambiguous, and a possible leak
            pools[split][qtype].setdefault(name, []).append(row)
    return pools


def _instantiate(world: World, tpl: Template, subject: str, contents: dict[str, str],
                 norm_contents: dict[str, str]) -> dict | None:
    node, gold = subject, []
    for i, rel in enumerate(tpl.path):
        ok, value = _unique_value(world, node, rel)
        if not ok:
            return None
        gold.append(world.passages_stating(node, rel)[0])
        if i < len(tpl.path) - 1:
            if rel not in ENTITY_RELATIONS:
                return None
            node = value
    answers = _answers(world, tpl.path[-1], value)
    if answers[0] not in contents[gold[-1]]:
        return None  # the corpus must state the answer in the form we grade
    if len(tpl.path) > 1:
        if len(set(gold)) < len(gold) or value == subject:
            return None
        key = f" {normalize_answer(answers[0])} "
        if any(key in norm_contents[p.doc_id] for p in world.passages_of(subject)):
            return None  # answerable from the subject's own article: not really two hops
    return {
        "id": f"{tpl.name}@{subject}",
        "question": tpl.text.format(s=world.name(subject)),
        "answers": answers,
        "type": "",
        "needs_search": True,
        "gold_doc_ids": gold,
        "hops": len(tpl.path),
    }


_POOL_CACHE: "weakref.WeakKeyDictionary[World, dict[float, Any]]" = weakref.WeakKeyDictionary()


def _pools(world: World, test_fraction: float) -> dict[str, dict[str, dict[str, list[dict]]]]:
    per_world = _POOL_CACHE.setdefault(world, {})
    if test_fraction not in per_world:
        per_world[test_fraction] = _candidates(world, test_fraction)
    return per_world[test_fraction]


def question_pool_sizes(world: World, test_fraction: float = 0.25) -> dict[str, dict[str, int]]:
    """How many distinct single-/multi-hop questions each split of ``world`` can supply."""
    return {s: {t: sum(len(v) for v in by_tpl.values()) for t, by_tpl in by_type.items()}
            for s, by_type in _pools(world, test_fraction).items()}


# ----------------------------------------------------------------------------- no-search questions
_WORDS = (
    "apple", "pear", "lantern", "garden", "river", "window", "basket", "candle", "pencil", "rocket",
    "orange", "forest", "silver", "castle", "dragon", "planet", "violin", "anchor", "bridge", "cactus",
    "meadow", "pirate", "saddle", "tunnel", "walnut", "zebra", "harbor", "kettle", "ladder", "marble",
    "needle", "parrot", "quilt", "shovel", "turtle", "velvet", "wagon", "yogurt", "breeze", "copper",
    "desert", "engine", "falcon", "glacier", "hammer", "island", "jacket", "kitten", "lemon", "mirror",
    "noodle", "oyster", "pepper", "rabbit", "spider", "tomato", "umbrella", "valley", "whistle",
    "blanket", "cherry", "donkey", "feather", "guitar", "honey", "insect", "jungle", "koala", "lizard",
    "monkey", "nectar", "olive", "puzzle", "rainbow", "sunset", "thunder", "tiger", "wizard", "pillow",
    "stone", "cloud", "paper", "bottle", "carpet", "helmet", "piano", "salmon", "ticket", "button",
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                 "eleven", "twelve", "thirteen", "fourteen", "fifteen")


def _ns_add(r: random.Random) -> tuple[str, list[str]]:
    a, b = r.randint(2, 99), r.randint(2, 99)
    return f"What is {a} plus {b}?", [str(a + b)]


def _ns_subtract(r: random.Random) -> tuple[str, list[str]]:
    a, b = sorted(r.sample(range(2, 100), 2), reverse=True)
    return f"What is {a} minus {b}?", [str(a - b)]


def _ns_multiply(r: random.Random) -> tuple[str, list[str]]:
    a, b = r.randint(2, 12), r.randint(2, 20)
    return f"What is {a} times {b}?", [str(a * b)]


def _ns_larger(r: random.Random) -> tuple[str, list[str]]:
    a, b = r.sample(range(1, 1000), 2)
    return f"Which number is larger, {a} or {b}?", [str(max(a, b))]


def _ns_alphabetical(r: random.Random) -> tuple[str, list[str]]:
    a, b = r.sample(_WORDS, 2)
    return f"Which word comes first alphabetically, '{a}' or '{b}'?", [min(a, b)]


def _ns_letters(r: random.Random) -> tuple[str, list[str]]:
    w = r.choice(_WORDS)
    return f"How many letters are in the word '{w}'?", [str(len(w)), _NUMBER_WORDS[len(w)]]


def _ns_reverse(r: random.Random) -> tuple[str, list[str]]:
    w = r.choice(_WORDS)
    return f"What is the word '{w}' spelled backwards?", [w[::-1]]


def _ns_uppercase(r: random.Random) -> tuple[str, list[str]]:
    w = r.choice(_WORDS)
    return f"What is the word '{w}' written in capital letters?", [w.upper()]


def _ns_next_day(r: random.Random) -> tuple[str, list[str]]:
    i = r.randrange(7)
    return f"Which day of the week comes after {_DAYS[i]}?", [_DAYS[(i + 1) % 7]]


def _ns_next_month(r: random.Random) -> tuple[str, list[str]]:
    i = r.randrange(12)
    return f"Which month comes after {_MONTHS[i]}?", [_MONTHS[(i + 1) % 12]]


NO_SEARCH_KINDS = {
    "add": _ns_add, "subtract": _ns_subtract, "multiply": _ns_multiply, "larger": _ns_larger,
    "alphabetical": _ns_alphabetical, "letters": _ns_letters, "reverse": _ns_reverse,
    "uppercase": _ns_uppercase, "next_day": _ns_next_day, "next_month": _ns_next_month,
}


def _no_search(n: int, rng: random.Random, split: str, test_fraction: float) -> list[dict]:
    out: list[dict] = []
    seen: set[str] = set()
    kinds = sorted(NO_SEARCH_KINDS)
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n + 1000:
            raise ValueError(f"could not find {n} distinct no-search questions for split {split!r}")
        kind = kinds[len(out) % len(kinds)] if attempts % 3 else rng.choice(kinds)
        question, answers = NO_SEARCH_KINDS[kind](rng)
        key = normalise_task_text(question)
        if key in seen or _text_split(question, test_fraction) != split:
            continue
        seen.add(key)
        digest = hashlib.blake2b(question.encode(), digest_size=5).hexdigest()
        out.append({"id": f"{kind}@{digest}", "question": question, "answers": answers, "type": "no_search",
                    "needs_search": False, "gold_doc_ids": [], "hops": 0})
    return out


# ----------------------------------------------------------------------------- sampling
def _allocate(n: int, mix: Mapping[str, float]) -> dict[str, int]:
    unknown = set(mix) - set(QUESTION_TYPES)
    if unknown:
        raise ValueError(f"unknown question types in mix: {sorted(unknown)}; known: {QUESTION_TYPES}")
    if any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"mix weights must be >= 0 and not all zero, got {dict(mix)}")
    total = sum(mix.values())
    exact = {t: n * mix.get(t, 0.0) / total for t in QUESTION_TYPES}
    counts = {t: int(v) for t, v in exact.items()}
    # Largest remainder, ties broken in QUESTION_TYPES order.
    for t in sorted(QUESTION_TYPES, key=lambda t: -(exact[t] - counts[t]))[: n - sum(counts.values())]:
        counts[t] += 1
    return counts


def _balanced(by_template: dict[str, list[dict]], k: int, rng: random.Random, label: str) -> list[dict]:
    """k candidates spread evenly over templates (so rare templates are not drowned out)."""
    available = sum(len(v) for v in by_template.values())
    if k > available:
        raise ValueError(f"only {available} {label} questions are available (asked for {k}); "
                         f"use a larger world size or a smaller n")
    queues = {name: rng.sample(rows, len(rows)) for name, rows in sorted(by_template.items())}
    out: list[dict] = []
    while len(out) < k:
        names = [nm for nm in sorted(queues) if queues[nm]]
        rng.shuffle(names)
        for nm in names[: k - len(out)]:
            out.append(queues[nm].pop())
    return out


def make_questions(world: World, n: int, seed: int = 0, split: str = "train",
                   mix: Mapping[str, float] | None = None, test_fraction: float = 0.25) -> list[dict]:
    """``n`` question rows for ``split``, deterministic in (world, n, seed, split, mix).

    Each row: ``{"id", "question", "answers", "type", "needs_search", "gold_doc_ids", "hops"}``.
    ``mix`` weights the three types (normalised; default 0.4 / 0.4 / 0.2); ``test_fraction`` is
    the share of entities (and no-search texts) reserved for the test split (:data:`VALIDATION_FRACTION`
    more go to validation).
    """
    check_split(split)
    if n < 0:
        raise ValueError("n must be >= 0")
    if not 0.0 < test_fraction < 1.0 - VALIDATION_FRACTION:
        raise ValueError(f"test_fraction must be in (0, {1.0 - VALIDATION_FRACTION}) (validation takes "
                         f"{VALIDATION_FRACTION} of the entities)")
    counts = _allocate(n, DEFAULT_MIX if mix is None else mix)
    rng = random.Random(f"agentgym.searchqa.questions:{world.seed}:{seed}:{split}")
    pools = _pools(world, test_fraction)[split]
    rows: list[dict] = []
    for qtype in ("single_hop", "multi_hop"):
        rows += _balanced(pools[qtype], counts[qtype], rng, f"{split} {qtype}")
    rows += _no_search(counts["no_search"], rng, split, test_fraction)
    rng.shuffle(rows)
    return [{**r, "answers": list(r["answers"]), "gold_doc_ids": list(r["gold_doc_ids"])} for r in rows]
