"""The identical-answer check: fixed questions with exact answers, greedy decoding, and a
comparison of two runs (T4 vs L4, bf16 vs QAT, patched vs unpatched) that reports how many
answers are identical and, for the first that differs, where it diverges."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gemma4_t4.bench.schemas import Answer

QUESTIONS: list[tuple[str, str]] = [
    ("What is the capital of France? Answer with one word.", "Paris"),
    ("What is 12 times 12? Answer with the number only.", "144"),
    ("What is the chemical symbol for gold? Answer with the symbol only.", "Au"),
    ("How many days are in a leap year? Answer with the number only.", "366"),
    ("What planet is known as the Red Planet? Answer with one word.", "Mars"),
    ("What is the square root of 81? Answer with the number only.", "9"),
    ("Who wrote 'Romeo and Juliet'? Answer with the surname only.", "Shakespeare"),
    ("What is the largest ocean on Earth? Answer with one word.", "Pacific"),
    ("How many sides does a hexagon have? Answer with the number only.", "6"),
    ("What is the boiling point of water at sea level in Celsius? Answer with the number only.", "100"),
    ("What gas do plants absorb from the air for photosynthesis? Answer with its formula.", "CO2"),
    ("What is 7 plus 15? Answer with the number only.", "22"),
    ("In which continent is Kenya? Answer with one word.", "Africa"),
    ("What is the freezing point of water in Fahrenheit? Answer with the number only.", "32"),
    ("What is the opposite of 'hot'? Answer with one word.", "cold"),
    ("How many minutes are in an hour? Answer with the number only.", "60"),
    ("What is the capital of Japan? Answer with one word.", "Tokyo"),
    ("What is 100 divided by 4? Answer with the number only.", "25"),
    ("Which element has the atomic number 1? Answer with one word.", "Hydrogen"),
    ("What colour do you get by mixing blue and yellow? Answer with one word.", "green"),
]


def is_correct(text: str, expected: str) -> bool:
    """The expected answer as the first word of the reply (case, punctuation ignored)."""
    words = text.strip().split()
    if not words:
        return False
    first = words[0].strip(".,;:!?*'\"()").lower()
    return first == expected.lower()


@dataclass
class Divergence:
    index: int
    question: str
    char: int  # first differing character
    a_context: str
    b_context: str


@dataclass
class AnswerComparison:
    total: int
    identical: int
    correct_a: int
    correct_b: int
    first_divergence: Divergence | None
    differing: list[int]

    def text(self) -> str:
        lines = [
            f"identical answers: {self.identical}/{self.total} "
            f"(correct: A {self.correct_a}, B {self.correct_b})"
        ]
        d = self.first_divergence
        if d:
            lines.append(f"first difference: question {d.index} ({d.question!r}) at character {d.char}:")
            lines.append(f"  A: ...{d.a_context!r}")
            lines.append(f"  B: ...{d.b_context!r}")
        return "\n".join(lines)


def first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare_answers(
    a: Sequence[Answer | Mapping[str, Any]], b: Sequence[Answer | Mapping[str, Any]]
) -> AnswerComparison:
    """Compare two answer lists (:class:`Answer` or its JSON: index, question, text, correct) by question index."""
    by_a = {r["index"]: r for r in a}
    by_b = {r["index"]: r for r in b}
    shared = sorted(set(by_a) & set(by_b))
    identical, differing = 0, []
    first: Divergence | None = None
    for i in shared:
        ta, tb = by_a[i].get("text") or "", by_b[i].get("text") or ""
        if ta == tb and by_a[i].get("error") is None and by_b[i].get("error") is None:
            identical += 1
            continue
        differing.append(i)
        if first is None:
            at = first_difference(ta, tb)
            lo = max(0, at - 20)
            first = Divergence(i, by_a[i].get("question", ""), at, ta[lo : at + 40], tb[lo : at + 40])
    return AnswerComparison(
        total=len(shared),
        identical=identical,
        correct_a=sum(1 for i in shared if by_a[i].get("correct")),
        correct_b=sum(1 for i in shared if by_b[i].get("correct")),
        first_divergence=first,
        differing=differing,
    )
