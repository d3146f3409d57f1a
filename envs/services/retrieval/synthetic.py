"""A deterministic synthetic corpus of invented people, with questions whose gold passage is known.

For measuring retrievers without downloading wiki-18: the names are invented, so neither an
encoder's pre-training nor luck answers for the index. Every passage names one person with a
profession, a birthplace, a birth year and a unique creation; passages share professions, towns
and years, and each also mentions another person (a hard negative for questions about them).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kl", "l", "m", "n", "p", "qu", "r", "s",
           "sh", "st", "t", "th", "v", "w", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "io", "ou"]
_CODAS = ["", "n", "r", "l", "s", "th", "x", "nd", "rk", "m"]
_PROFESSIONS = ["astronomer", "cartographer", "glassblower", "composer", "botanist", "clockmaker",
                "architect", "poet", "shipwright", "chemist", "weaver", "painter", "mathematician",
                "sculptor", "physician", "engineer", "linguist", "beekeeper", "printer", "violinist"]
_ADJECTIVES = ["amber", "silver", "crimson", "hollow", "northern", "whispering", "iron", "velvet",
               "sunken", "gilded", "frozen", "emerald", "broken", "floating", "midnight", "copper",
               "painted", "eternal", "crooked", "golden", "ashen", "hidden", "lunar", "scarlet",
               "woven", "distant", "quiet", "burning", "marble", "twin", "azure", "bronze", "coral",
               "drifting", "ember", "fallen", "glass", "harbor", "ivory", "jade", "kindled", "last",
               "mirrored", "onyx", "pale", "restless", "salt", "thorned", "umber", "winter"]
_WORKS = ["lighthouse", "codex", "symphony", "telescope", "atlas", "cathedral", "herbarium", "clock",
          "bridge", "sonnet", "loom", "fresco", "theorem", "orrery", "chalice", "harp", "almanac",
          "lantern", "tapestry", "compass", "observatory", "garden", "fountain", "engine", "mosaic",
          "carillon", "labyrinth", "sextant", "manuscript", "organ", "aqueduct", "ballad", "canal",
          "dial", "elegy", "ferry", "globe", "hymnal", "icon", "kiln", "ledger", "mill", "nocturne",
          "obelisk", "pavilion", "quilt", "requiem", "stage", "tower", "vault"]
_TEMPLATES = [
    "{name} was a {profession} born in {town} in {year}. {last} is best known for creating the {work}, "
    "and later worked alongside {other} in {town2}.",
    "Born in {year} in the town of {town}, {name} became a celebrated {profession}. The {work} is "
    "{last}'s most famous creation; {last} was a close friend of {other}.",
    "{name} ({year}) was a {profession} from {town}. After meeting {other}, {last} moved to {town2} "
    "and there created the {work}.",
]


@dataclass(frozen=True)
class SyntheticQuestion:
    question: str
    answer: str
    doc_id: str  # the gold passage
    kind: str  # birthplace | year | creator | profession


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_CODAS)


def synthetic_corpus(
    n_docs: int = 200, seed: int = 0
) -> tuple[list[dict[str, str]], list[SyntheticQuestion]]:
    """``(docs, questions)``: Search-R1 jsonl rows and four questions per passage."""
    if n_docs > len(_ADJECTIVES) * len(_WORKS):
        raise ValueError(f"at most {len(_ADJECTIVES) * len(_WORKS)} docs (unique creations)")
    rng = random.Random(seed)
    towns = sorted({_word(rng, 2).capitalize() for _ in range(40)})
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < n_docs:
        name = f"{_word(rng, 2).capitalize()} {_word(rng, rng.choice([2, 3])).capitalize()}"
        if name not in seen:
            seen.add(name)
            names.append(name)
    works = rng.sample([f"{a.capitalize()} {w.capitalize()}" for a in _ADJECTIVES for w in _WORKS], n_docs)
    docs: list[dict[str, str]] = []
    questions: list[SyntheticQuestion] = []
    for i, (name, work) in enumerate(zip(names, works)):
        profession, town, town2 = rng.choice(_PROFESSIONS), rng.choice(towns), rng.choice(towns)
        year = str(rng.randint(1650, 1950))
        other = names[(i + rng.randint(1, n_docs - 1)) % n_docs] if n_docs > 1 else name
        text = rng.choice(_TEMPLATES).format(
            name=name, last=name.split()[1], profession=profession, town=town, town2=town2,
            year=year, work=work, other=other,
        )
        doc_id = str(i)
        docs.append({"id": doc_id, "contents": f'"{name}"\n{text}'})
        questions += [
            SyntheticQuestion(f"Where was {name} born?", town, doc_id, "birthplace"),
            SyntheticQuestion(f"In what year was {name} born?", year, doc_id, "year"),
            SyntheticQuestion(f"Who created the {work}?", name, doc_id, "creator"),
            SyntheticQuestion(f"What was the profession of {name}?", profession, doc_id, "profession"),
        ]
    return docs, questions
