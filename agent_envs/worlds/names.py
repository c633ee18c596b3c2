"""Fictional, pronounceable names for the knowledge-base and web worlds.

Every word a `NameMaker` returns is new within that maker, so a name's words occur only where
that entity is mentioned: a search for the name finds exactly the passages about it. Words are
at least two syllables and never common English words (which a search index may drop as
stopwords or an answer normaliser may drop as articles).

    >>> from random import Random
    >>> names = NameMaker(Random(0))
    >>> w = names.word()
    >>> w == w.capitalize() and w != names.word()
    True
"""

from __future__ import annotations

from random import Random

_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "gr",
    "kr",
    "tr",
    "st",
)
_VOWELS = ("a", "e", "i", "o", "u", "a", "o", "ai", "ea")
_CODAS = ("", "", "", "n", "r", "l", "m", "k")

# Generated words must never be ordinary English (stopwords, template words, answer articles).
_RESERVED_WORDS = (
    "a an the and or of in on at to is it its be been by for from has had was were who what which where when "
    "how city country person people company university event events home page club chair treasurer secretary "
    "made makes born based founded located capital province town year month none more most some such than "
    "then there these they this those very will with about after before below above over under again"
)
_RESERVED = frozenset(_RESERVED_WORDS.split())


class NameMaker:
    """Draws unique capitalised pseudo-words from a seeded RNG."""

    def __init__(self, rng: Random) -> None:
        self.rng = rng
        self.used: set[str] = set(_RESERVED)

    def word(self, min_syllables: int = 2, max_syllables: int = 3) -> str:
        for _ in range(10_000):
            n = self.rng.randint(min_syllables, max_syllables)
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(n - 1))
            w += self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
            # A trailing "s" lets stemmers merge two names ("Kela"/"Kelas"); the codas never end in s.
            if w not in self.used and len(w) >= 4:
                self.used.add(w)
                return w.capitalize()
        raise RuntimeError("name space exhausted: ask for fewer entities or allow more syllables")

    def person(self) -> str:
        return f"{self.word(2, 2)} {self.word()}"
