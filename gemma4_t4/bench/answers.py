"""The identical-answer check: fixed questions with exact answers, greedy decoding, and a
comparison of two runs (T4 vs L4, bf16 vs QAT, patched vs unpatched) that reports how many
answers are identical and, for the first that differs, where it diverges."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from gemma4_t4.bench.results import BenchRun
from gemma4_t4.bench.schemas import Answer

QUESTIONS = [
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
    words = text.split()
    return bool(words) and words[0].strip(".,;:!?*'\"()").lower() == expected.lower()


@dataclass
class Divergence:
    index: int
    question: str
    char: int  # first differing character
    a_context: str
    b_context: str


@dataclass
class AnswerComparison:
    """How many answers two runs share. ``measured`` is False (with ``reason``) when either side
    is not a complete set of answers (a run that stopped or failed, an answer that errored): then
    the counts are not a result and :meth:`line` says "not measured: ..." instead of "0/20"."""

    total: int
    identical: int
    correct_a: int
    correct_b: int
    first_divergence: Divergence | None
    differing: list[int]
    measured: bool = True
    reason: str | None = None

    @classmethod
    def not_measured(cls, reason: str) -> AnswerComparison:
        return cls(0, 0, 0, 0, None, [], measured=False, reason=reason)

    @property
    def all_identical(self) -> bool:
        return self.measured and self.total > 0 and self.identical == self.total

    def line(self) -> str:
        """The headline figure: "n/N", or "not measured: <reason>"."""
        return f"{self.identical}/{self.total}" if self.measured else f"not measured: {self.reason}"

    def text(self) -> str:
        if not self.measured:
            return f"identical answers: {self.line()}"
        lines = [
            f"identical answers: {self.identical}/{self.total} "
            f"(correct: A {self.correct_a}, B {self.correct_b})"
        ]
        d = self.first_divergence
        if d:
            lines += [
                f"first difference: question {d.index} ({d.question!r}) at character {d.char}:",
                f"  A: ...{d.a_context!r}",
                f"  B: ...{d.b_context!r}",
            ]
        return "\n".join(lines)


def first_difference(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


AnswerSource = BenchRun | Sequence[Answer]


def _answers_of(side: str, source: AnswerSource) -> dict[int, Answer] | str:
    """The answers by question index, or (a string) why they are not a result."""
    if isinstance(source, BenchRun) and source.not_measured:
        return f"{side}: {source.not_measured}"
    answers = source.answers() if isinstance(source, BenchRun) else list(source)
    if not answers:
        return f"{side} holds no answers"
    failed = [r for r in answers if r.error is not None]
    if failed:
        return f"{side}: {len(failed)} of {len(answers)} answers failed (first: {failed[0].error})"
    return {r.index: r for r in answers}


def compare_answers(a: AnswerSource, b: AnswerSource) -> AnswerComparison:
    """Compare two answer sets by question index: a :class:`BenchRun` of the answers workload, or
    its answers (:class:`Answer`: index, question, text, correct, error). A run that
    did not complete, or an answer that errored, makes the comparison not measured (never "0/20")."""
    by_a, by_b = _answers_of("A", a), _answers_of("B", b)
    whys = [side for side in (by_a, by_b) if isinstance(side, str)]
    if whys:
        return AnswerComparison.not_measured("; ".join(whys))
    shared = sorted(set(by_a) & set(by_b))
    if not shared:
        return AnswerComparison.not_measured("A and B answered no question in common")
    differing = [i for i in shared if by_a[i].text != by_b[i].text]
    first: Divergence | None = None
    if differing:
        i = differing[0]
        ta, tb = by_a[i].text, by_b[i].text
        at = first_difference(ta, tb)
        lo = max(0, at - 20)
        first = Divergence(i, by_a[i].question, at, ta[lo : at + 40], tb[lo : at + 40])
    return AnswerComparison(
        total=len(shared),
        identical=len(shared) - len(differing),
        correct_a=sum(by_a[i].correct for i in shared),
        correct_b=sum(by_b[i].correct for i in shared),
        first_divergence=first,
        differing=differing,
    )
