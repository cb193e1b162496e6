"""A small, safe arithmetic-expression parser with exact ``Fraction`` evaluation.

Grammar (whitespace ignored between tokens)::

    expr   := term   (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"

``×``, ``÷`` and ``−`` are accepted as spellings of ``*``, ``/`` and ``-``. There is no unary
operator, no exponent and no name of any kind, so nothing a model writes can reach Python: text
is tokenized by hand and evaluated by this module only (never ``eval`` or ``ast``). Limits on the
input length, the number of digits in a literal and the parenthesis depth keep every call fast and
free of ``RecursionError``. Every malformed input raises :class:`ExpressionError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

MAX_EXPRESSION_CHARS = 512
MAX_LITERAL_DIGITS = 12
MAX_PAREN_DEPTH = 32

_OPERATOR_SPELLINGS = {"+": "+", "-": "-", "*": "*", "/": "/", "×": "*", "÷": "/", "−": "-", "(": "(", ")": ")"}


class ExpressionError(ValueError):
    """The text is not an expression of the grammar, breaks a size limit, or divides by zero."""


@dataclass(frozen=True)
class ParsedExpression:
    """The exact value of an expression and the integer literals it uses, in order of appearance."""

    value: Fraction
    literals: tuple[int, ...]


def tokenize(text: str) -> list[str | int]:
    """Split ``text`` into integer literals and operator/parenthesis characters.

    Raises :class:`ExpressionError` on any other character, an over-long input or literal.
    """
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression has {len(text)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    tokens: list[str | int] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif char in "0123456789":
            start = i
            while i < len(text) and text[i] in "0123456789":
                i += 1
            if i - start > MAX_LITERAL_DIGITS:
                raise ExpressionError(f"number at offset {start} has {i - start} digits; limit {MAX_LITERAL_DIGITS}")
            tokens.append(int(text[start:i]))
        elif char in _OPERATOR_SPELLINGS:
            tokens.append(_OPERATOR_SPELLINGS[char])
            i += 1
        else:
            raise ExpressionError(f"unexpected character {char!r} at offset {i}")
    return tokens


class _Parser:
    """Recursive descent over a token list; depth is bounded by ``MAX_PAREN_DEPTH``."""

    def __init__(self, tokens: list[str | int]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.literals: list[int] = []

    def peek(self) -> str | int | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def parse(self) -> Fraction:
        if not self.tokens:
            raise ExpressionError("empty expression")
        value = self.expr(depth=0)
        if self.pos != len(self.tokens):
            raise ExpressionError(f"unexpected token {self.tokens[self.pos]!r} after a complete expression")
        return value

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.factor(depth)
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise ExpressionError("division by zero")
            else:
                value = value / rhs
        return value

    def factor(self, depth: int) -> Fraction:
        token = self.peek()
        if isinstance(token, int):
            self.pos += 1
            self.literals.append(token)
            return Fraction(token)
        if token == "(":
            if depth >= MAX_PAREN_DEPTH:
                raise ExpressionError(f"parentheses nested deeper than {MAX_PAREN_DEPTH}")
            self.pos += 1
            value = self.expr(depth + 1)
            if self.peek() != ")":
                raise ExpressionError("missing closing parenthesis")
            self.pos += 1
            return value
        found = "end of input" if token is None else repr(token)
        raise ExpressionError(f"expected a number or '(' but found {found}")


def parse_expression(text: str) -> ParsedExpression:
    """Parse and evaluate ``text`` exactly; raises :class:`ExpressionError` if it is not a valid expression."""
    parser = _Parser(tokenize(text))
    value = parser.parse()
    return ParsedExpression(value=value, literals=tuple(parser.literals))
