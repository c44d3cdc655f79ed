"""-k EXPRESSION, as pytest reads it: words matched as case-insensitive substrings of
an id, combined with and, or, not and parentheses ("decode and not f16",
"(causal or window) and gqa"). Several -k options: an id matching any of them."""

from __future__ import annotations

import re
from collections.abc import Callable

from .errors import ProbeError

# a word: what an id is made of (letters, digits, - _ . : + / @ [ ]); the rest splits
_TOKEN = re.compile(r"\s*(\(|\)|[\w\-.:+/@\[\]=]+)")
_KEYWORDS = ("and", "or", "not")

Matcher = Callable[[str], bool]


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = self._tokenize(text)
        self.at = 0

    def _tokenize(self, text: str) -> list[str]:
        out, pos = [], 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None:
                raise self.error(f"unexpected {text[pos:].strip()[0]!r}")
            out.append(m.group(1))
            pos = m.end()
        return out

    def error(self, why: str) -> ProbeError:
        return ProbeError(f"-k {self.text!r}: {why} (an expression of words with and, or, not "
                          "and parentheses, e.g. -k 'decode and not f16')")

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise self.error("it ends too soon")
        self.at += 1
        return tok

    def parse(self) -> Matcher:
        if not self.tokens:
            raise self.error("it is empty")
        m = self.expr()
        if self.peek() is not None:
            raise self.error(f"unexpected {self.peek()!r}")
        return m

    def expr(self) -> Matcher:
        terms = [self.conj()]
        while self.peek() == "or":
            self.take()
            terms.append(self.conj())
        return terms[0] if len(terms) == 1 else (lambda s: any(t(s) for t in terms))

    def conj(self) -> Matcher:
        terms = [self.neg()]
        while self.peek() == "and":
            self.take()
            terms.append(self.neg())
        return terms[0] if len(terms) == 1 else (lambda s: all(t(s) for t in terms))

    def neg(self) -> Matcher:
        tok = self.take()
        if tok == "not":
            inner = self.neg()
            return lambda s: not inner(s)
        if tok == "(":
            inner = self.expr()
            if self.take() != ")":
                raise self.error("a '(' is not closed")
            return inner
        if tok in (")", "and", "or"):
            raise self.error(f"unexpected {tok!r}")
        word = tok.lower()
        return lambda s: word in s.lower()


def compile_filter(expressions: list[str] | None) -> Matcher | None:
    """A predicate over ids for the -k options given (None: no -k, every id)."""
    if not expressions:
        return None
    matchers = [_Parser(e).parse() for e in expressions]
    if len(matchers) == 1:
        return matchers[0]
    return lambda s: any(m(s) for m in matchers)


def words(expression: str) -> list[str]:
    """The words of an expression, keywords left out (a hint when nothing matches)."""
    return [t for t in _TOKEN.findall(expression) if t not in _KEYWORDS + ("(", ")")]
