"""Compare answers printed in the docs with real answers: JSON with `...`, text lines, numbers as rounded.

Docs print answers shortened and rounded. Here `...` stands for "more here": a member `...`
in an object allows other keys, an element `...` in an array any number of elements there
(`[0, 1, ...]` is a prefix), and `...` as a value (`[...top 5...]` in an array, with a note
between the dots) anything. A printed number matches when it is the real number rounded to
the digits printed: within half a unit of its last digit, plus 0.01 % for drift between
machines; a printed integer must match exactly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

ELLIPSIS = re.compile(r"\.\.\.(?:[^\[\]{},\"\n]*?\.\.\.)?")  # `...`, or `...a note...`
NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
RELATIVE_SLACK = 1e-4


class More:
    """`...` in printed JSON."""

    def __repr__(self) -> str:
        return "..."


MORE = More()


@dataclass(frozen=True)
class Printed:
    """A number as the docs print it: its value and its text (which says how it was rounded)."""

    value: float
    text: str

    @property
    def is_integer(self) -> bool:
        return not any(c in self.text for c in ".eE")

    def tolerance(self) -> float:
        """Half a unit of the last printed digit, plus the relative slack."""
        mantissa, _, exponent = self.text.lower().partition("e")
        decimals = len(mantissa.partition(".")[2])
        unit = 10.0 ** (int(exponent or 0) - decimals)
        return 0.5 * unit + RELATIVE_SLACK * abs(self.value)

    def matches(self, got: object) -> bool:
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return False
        if self.is_integer:
            return got == self.value
        return math.isfinite(got) and abs(got - self.value) <= self.tolerance()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"printed JSON: {what} at {self.pos}: {self.text[self.pos : self.pos + 40]!r}")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos : self.pos + 1]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self.fail(f"expected {char!r}")
        self.pos += 1

    def more(self) -> bool:
        """Consume a `...` token if one is next."""
        self.skip()
        match = ELLIPSIS.match(self.text, self.pos)
        if match is None:
            return False
        self.pos = match.end()
        return True

    def value(self) -> Any:
        if self.more():
            return MORE
        char = self.peek()
        if char == "{":
            return self.members()
        if char == "[":
            return self.elements()
        if char == '"':
            return self.string()
        for word, literal in (("true", True), ("false", False), ("null", None)):
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return literal
        match = NUMBER.match(self.text, self.pos)
        if match is None:
            raise self.fail("expected a value")
        self.pos = match.end()
        return Printed(float(match.group()), match.group())

    def string(self) -> str:
        self.expect('"')
        out: list[str] = []
        while True:
            if self.pos >= len(self.text):
                raise self.fail("unterminated string")
            char = self.text[self.pos]
            self.pos += 1
            if char == '"':
                return "".join(out)
            if char == "\\":
                escaped = self.text[self.pos]
                self.pos += 1
                if escaped == "u":
                    out.append(chr(int(self.text[self.pos : self.pos + 4], 16)))
                    self.pos += 4
                else:
                    out.append({"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(escaped, escaped))
            else:
                out.append(char)

    def members(self) -> dict[Any, Any]:
        self.expect("{")
        out: dict[Any, Any] = {}
        while self.peek() != "}":
            if self.more():
                out[MORE] = MORE
            else:
                key = self.string()
                self.expect(":")
                out[key] = self.value()
            if self.peek() != ",":
                break
            self.pos += 1
        self.expect("}")
        return out

    def elements(self) -> list[Any]:
        self.expect("[")
        out: list[Any] = []
        while self.peek() != "]":
            out.append(self.value())
            if self.peek() != ",":
                break
            self.pos += 1
        self.expect("]")
        return out


def parse_printed(text: str) -> Any:
    """Printed JSON into dicts, lists, `Printed` numbers and `MORE` markers."""
    parser = _Parser(text)
    value = parser.value()
    if parser.peek():
        raise parser.fail("trailing text")
    return value


def mismatches(printed: Any, got: Any, path: str = "$") -> list[str]:
    """Where the real answer `got` differs from the printed one (empty: it matches)."""
    if printed is MORE:
        return []
    if isinstance(printed, Printed):
        return [] if printed.matches(got) else [f"{path}: printed {printed.text}, got {got!r}"]
    if isinstance(printed, dict):
        if not isinstance(got, dict):
            return [f"{path}: printed an object, got {got!r}"[:300]]
        named = {k: v for k, v in printed.items() if k is not MORE}
        out = [f"{path}: no key {k!r}" for k in named if k not in got]
        if MORE not in printed:
            out += [f"{path}: key {k!r} not printed (and no ...)" for k in got if k not in named]
        for key, value in named.items():
            if key in got:
                out += mismatches(value, got[key], f"{path}.{key}")
        return out
    if isinstance(printed, list):
        if not isinstance(got, list):
            return [f"{path}: printed an array, got {got!r}"[:300]]
        marks = [i for i, v in enumerate(printed) if v is MORE]
        head = printed[: marks[0]] if marks else printed
        tail = printed[marks[-1] + 1 :] if marks else []
        if (not marks and len(got) != len(printed)) or len(got) < len(head) + len(tail):
            return [f"{path}: printed {len(printed)} elements, got {len(got)}"]
        pairs = list(zip(head, got, strict=False)) + list(zip(tail, got[len(got) - len(tail) :], strict=True))
        out = []
        for index, (p, g) in enumerate(pairs):
            at = index if index < len(head) else len(got) - len(tail) + index - len(head)
            out += mismatches(p, g, f"{path}[{at}]")
        return out
    return [] if printed == got and type(printed) is type(got) else [f"{path}: printed {printed!r}, got {got!r}"]


def text_mismatches(printed: str, got: str) -> list[str]:
    """Printed lines, in runs separated by `...` lines, must appear in `got` in order, each run contiguously."""
    lines = [line.rstrip() for line in got.splitlines()]
    runs: list[list[str]] = [[]]
    for line in printed.strip("\n").splitlines():
        if line.strip() == "...":
            runs.append([])
        else:
            runs[-1].append(line.rstrip())
    start = 0
    for run in (r for r in runs if r):
        found = next((i for i in range(start, len(lines) - len(run) + 1) if lines[i : i + len(run)] == run), None)
        if found is None:
            return [f"not in the answer (after line {start}): {run}"]
        start = found + len(run)
    return []


TOKEN = re.compile(rf"{NUMBER.pattern}|\s+|.", re.DOTALL)


def output_mismatches(printed: str, got: str) -> list[str]:
    """Printed program output: numbers as rounded (see `Printed`), everything else exactly, up to spacing."""

    def tokens(text: str) -> list[str]:
        return [t if not t.isspace() else " " for t in TOKEN.findall(text.strip())]

    want, have = tokens(printed), tokens(got)
    if len(want) != len(have):
        return [f"printed {printed.strip()!r}, got {got.strip()!r}"]
    out = []
    for w, h in zip(want, have, strict=True):
        if NUMBER.fullmatch(w) and NUMBER.fullmatch(h):
            if not Printed(float(w), w).matches(float(h)):
                out.append(f"printed {w}, got {h}")
        elif w != h:
            out.append(f"printed {w!r}, got {h!r} in {got.strip()!r}")
    return out
