"""The searchqa world's vocabulary: word lists, sentence tables and the syllable name generator.

These are data, kept apart from :mod:`agentgym.envs.searchqa.world` so the generator and the renderer
read top to bottom. Changing any table changes every generated world (and so the bundled dataset):
the tables are part of the world's seed contract.
"""

from __future__ import annotations

import random
import re

from agentgym.rewards import normalize_answer

__all__ = ["NameForge", "PROFESSIONS", "INDUSTRIES", "GENRES", "COLOUR", "COMPANY_SUFFIXES", "UNIVERSITY_PATTERNS",
           "BAND_PATTERNS"]

PROFESSIONS = (
    "engineer", "geologist", "architect", "chemist", "physician", "historian", "journalist",
    "economist", "botanist", "painter", "novelist", "mathematician", "lawyer", "pilot", "teacher",
    "photographer", "astronomer", "chef", "sculptor", "linguist", "pharmacist", "cartographer",
)
INDUSTRIES = (
    "software", "shipbuilding", "textile", "pharmaceutical", "mining", "aviation", "publishing",
    "telecommunications", "food processing", "robotics", "banking", "furniture", "glassmaking",
    "solar energy", "logistics", "toy", "chocolate", "bicycle",
)
GENRES = (
    "jazz", "folk", "punk rock", "synth-pop", "heavy metal", "bluegrass", "reggae", "indie rock",
    "soul", "ambient", "hip hop", "ska", "baroque pop", "grunge", "surf rock", "gospel",
)
# Fact-free "colour" sentences: they make passages read like encyclopedia text and give retrievers
# realistic lexical noise, while stating nothing a question could ask about.
COLOUR = {
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
COMPANY_SUFFIXES = ("Industries", "Works", "Systems", "Group", "Labs", "Holdings", "Dynamics", "Foundry")
UNIVERSITY_PATTERNS = ("{w} University", "{w} State University", "{w} Institute of Technology", "{w} College")
BAND_PATTERNS = ("{w}", "The {w} Lanterns", "{w} Parade", "{w} Collective", "The {w} Echoes", "{w} Static")

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
