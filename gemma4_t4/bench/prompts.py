"""Deterministic prompts of exact token length, unique by construction.

Lengths are checked with the served model's own tokenizer: the server's ``/tokenize`` and
``/detokenize`` (vLLM), or a local Hugging Face tokenizer. Each prompt starts with a header
made of the run's nonce, a tag and an index, so no two prompts (and no warm-up prompt) share
even their first KV block: prefix-cache hits can only come from prefixes shared on purpose.
Words come from a seeded generator, so (seed, nonce) reproduce every prompt exactly.
"""

from __future__ import annotations

import json
import random
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass

from gemma4_t4.bench.schemas import RawJSON
from gemma4_t4.errors import Gemma4T4Error

WORDS = [
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
    "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week",
    "company", "system", "program", "question", "work", "government", "number", "night", "point", "home",
    "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book",
    "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend", "father",
    "power", "hour", "game", "line", "end", "member", "law", "car", "city", "community", "name", "president",
    "team", "minute", "idea", "kid", "body", "information", "back", "parent", "face", "others", "level",
    "office", "door", "health", "person", "art", "war", "history", "party", "result", "change", "morning",
    "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education", "foot", "boy",
    "age", "policy", "music", "market", "sense", "nation", "plan", "college", "interest", "death",
    "experience", "effect", "class", "control", "care", "field", "development", "role", "effort", "rate",
    "heart", "drug", "show", "leader", "light", "voice", "wife", "police", "mind", "price", "report",
    "decision", "son", "view", "relationship", "town", "road", "river", "memory", "paper", "green", "blue",
    "quick", "brown", "lazy", "bright", "quiet", "simple", "strong", "early", "late", "small", "large",
]  # fmt: skip


class ServerTokenizer:
    """The served model's tokenizer through vLLM's ``/tokenize`` and ``/detokenize``."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.source = "server /tokenize"

    def _post(self, path: str, **fields: object) -> RawJSON:
        """POST ``fields`` for the served model to ``path``."""
        body = json.dumps({"model": self.model, **fields}).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(self.base_url + path, data=body, headers=headers)
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=30.0) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise Gemma4T4Error(
                f"POST {path} on {self.base_url} returned HTTP {exc.code}",
                fix="use a vLLM server (it serves /tokenize) or pass a local tokenizer (--tokenizer PATH)",
            ) from None
        except OSError as exc:  # URLError included
            raise Gemma4T4Error(
                f"cannot reach {self.base_url}{path}: {exc}",
                fix="check --base-url and that the server is running",
            ) from None

    def count(self, text: str, chat: bool = False) -> int:
        asked = (
            {"messages": [{"role": "user", "content": text}], "add_generation_prompt": True}
            if chat
            else {"prompt": text}
        )
        return int(self._post("/tokenize", **asked)["count"])

    def encode(self, text: str) -> list[int]:
        return list(self._post("/tokenize", prompt=text, add_special_tokens=False)["tokens"])

    def decode(self, ids: list[int]) -> str:
        return str(self._post("/detokenize", tokens=ids)["prompt"])


class HFTokenizer:
    """A local Hugging Face tokenizer (the same model's), for servers without ``/tokenize``."""

    def __init__(self, path: str):
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise Gemma4T4Error(
                "transformers is not installed", fix="pip install 'gemma4-t4[model]'"
            ) from exc
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.source = f"local tokenizer {path}"

    def count(self, text: str, chat: bool = False) -> int:
        if chat:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True
            )
            if isinstance(ids, dict):
                ids = ids["input_ids"]
            return len(ids)
        return len(self.tokenizer(text)["input_ids"])

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


# the served model's tokenizer: both count, encode and decode alike
Tokenizer = ServerTokenizer | HFTokenizer


@dataclass
class Prompt:
    text: str
    tokens: int  # measured with the tokenizer (template included on chat): the record keeps it


class PromptFactory:
    """Builds exact-length prompts. ``nonce`` defaults to a fresh random value per factory, so a
    re-run on a live server never hits cache left by an earlier run; record it to reproduce."""

    def __init__(self, tokenizer: Tokenizer, seed: int = 0, nonce: str | None = None, chat: bool = False):
        self.tokenizer = tokenizer
        self.seed = seed
        self.nonce = nonce or secrets.token_hex(4)
        self.chat = chat

    def _words(self, key: str, tokens: int) -> str:
        """Seeded words, twice ``tokens`` of them: more than a prompt of ``tokens`` is cut from."""
        rng = random.Random(f"{self.seed}:{key}")
        return " ".join(rng.choice(WORDS) for _ in range(max(8, 2 * tokens)))

    def header(self, tag: str, index: int) -> str:
        """What a prompt (or a group's prefix) starts with, a space after it."""
        return f"[{self.nonce} {tag} {index}] "

    def fit(self, lead: str, body: str, target: int, chat: bool | None = None) -> Prompt:
        """``lead`` + the longest start of ``body`` whose tokenized length is exactly ``target``
        (counted with the chat template unless ``chat`` is False)."""
        tok = self.tokenizer
        chat = self.chat if chat is None else chat
        body_ids = tok.encode(body)
        base = tok.count(lead, chat=chat)
        cut = max(0, target - base)
        best: Prompt | None = None
        seen: set[int] = set()
        for _ in range(12):
            if cut > len(body_ids):
                raise Gemma4T4Error(
                    f"prompt body too short for {target} tokens",
                    fix="report this: the filler text must be longer",
                )
            seen.add(cut)
            text = lead + tok.decode(body_ids[:cut])
            n = tok.count(text, chat=chat)
            if best is None or abs(n - target) < abs(best.tokens - target):
                best = Prompt(text, n)
            if n == target:
                return best
            step = target - n
            nxt = cut + step
            if nxt in seen:  # oscillating: walk one token at a time
                nxt = cut + (1 if step > 0 else -1)
                if nxt in seen:
                    break
            cut = max(0, nxt)
        assert best is not None
        return best  # closest reachable; the record keeps its length and the target

    def unique(self, tag: str, count: int, length: int) -> list[Prompt]:
        """``count`` prompts of ``length`` tokens, no two sharing a first KV block."""
        return [
            self.fit(self.header(tag, i), self._words(f"{tag}:{i}", length), length) for i in range(count)
        ]

    def shared_prefix(
        self, tag: str, groups: int, per_group: int, prefix_len: int, length: int
    ) -> list[list[Prompt]]:
        """``groups`` of ``per_group`` prompts; within a group the first ``prefix_len`` tokens are
        identical, the rest unique. Group prefixes differ from their first tokens."""
        if prefix_len >= length:
            raise Gemma4T4Error(
                f"prefix length {prefix_len} must be below the input length {length}",
                fix="use --prefix-len smaller than --input-len",
            )
        out = []
        for g in range(groups):
            # the prefix is raw text; the template wraps the whole prompt later
            prefix = self.fit(
                self.header(f"{tag}-g", g), self._words(f"{tag}:g{g}", prefix_len), prefix_len, chat=False
            )
            group = []
            for i in range(per_group):
                lead = prefix.text + " " + self.header(f"{tag}-g{g}", i)
                group.append(self.fit(lead, self._words(f"{tag}:g{g}:{i}", length), length))
            out.append(group)
        return out
