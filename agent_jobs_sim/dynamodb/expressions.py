"""DynamoDB's expression language, parsed: a tokenizer and a recursive-descent parser for condition, filter and key
condition expressions, update expressions and projection expressions. Each distinct expression string is parsed once.

Precedence, loosest first: OR, AND, NOT, then BETWEEN / IN / comparisons and functions; parentheses group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path as FilePath


class ExpressionError(ValueError):
    """An expression DynamoDB would reject (the message is the ValidationException's)."""


PathPart = str | int


@dataclass(frozen=True, slots=True)
class Path:
    """A document path: attribute names (literal or `#placeholder`) and list indexes."""

    parts: tuple[PathPart, ...]


@dataclass(frozen=True, slots=True)
class Placeholder:
    name: str  # ":value"


@dataclass(frozen=True, slots=True)
class Call:
    """A function: size, if_not_exists, list_append (operands) or attribute_exists, attribute_not_exists,
    attribute_type, begins_with, contains (conditions)."""

    name: str
    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Arithmetic:
    operator: str  # "+" or "-"
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Compare:
    operator: str  # = <> < <= > >=
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node


@dataclass(frozen=True, slots=True)
class In:
    operand: Node
    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Logical:
    operator: str  # AND, OR
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


Node = Path | Placeholder | Call | Arithmetic | Compare | Between | In | Logical | Not


@dataclass(frozen=True, slots=True)
class UpdateAction:
    clause: str  # SET, REMOVE, ADD, DELETE
    path: Path
    value: Node | None  # None for REMOVE


@dataclass(frozen=True, slots=True)
class Parsed:
    """A parsed expression and the placeholders it uses."""

    root: object  # a Node (condition), a tuple of UpdateAction (update) or a tuple of Path (projection)
    names: frozenset[str]
    values: frozenset[str]


CONDITION_FUNCTIONS = frozenset(
    {"attribute_exists", "attribute_not_exists", "attribute_type", "begins_with", "contains"}
)
OPERAND_FUNCTIONS = frozenset({"size"})
UPDATE_FUNCTIONS = frozenset({"if_not_exists", "list_append"})
COMPARATORS = frozenset({"=", "<>", "<", "<=", ">", ">="})
CLAUSES = ("SET", "REMOVE", "ADD", "DELETE")
_TOKEN = re.compile(
    r"\s*(?:(?P<number>\d+)|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<name>#[A-Za-z0-9_]+)|(?P<value>:[A-Za-z0-9_]+)"
    r"|(?P<symbol><>|<=|>=|[=<>(),.\[\]+\-]))"
)
# DynamoDB's reserved words: an attribute named like one must be written with a #placeholder.
RESERVED_WORDS = frozenset((FilePath(__file__).parent / "reserved_words.txt").read_text().split())
_ARITY = {
    "attribute_exists": 1,
    "attribute_not_exists": 1,
    "attribute_type": 2,
    "begins_with": 2,
    "contains": 2,
    "size": 1,
    "if_not_exists": 2,
    "list_append": 2,
}


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position, end = 0, len(text.rstrip())
    while position < end:
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise ExpressionError(
                f'Syntax error; token: "{text[position:].strip()[:1]}", near: "{text[position:][:8]}"'
            )
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.position = 0
        self.names: set[str] = set()
        self.values: set[str] = set()

    # Tokens.
    def peek(self, offset: int = 0) -> tuple[str, str]:
        index = self.position + offset
        return self.tokens[index] if index < len(self.tokens) else ("end", "<EOF>")

    def keyword(self, word: str) -> bool:
        kind, text = self.peek()
        if kind == "word" and text.upper() == word:
            self.position += 1
            return True
        return False

    def symbol(self, symbol: str) -> bool:
        if self.peek() == ("symbol", symbol):
            self.position += 1
            return True
        return False

    def expect(self, symbol: str) -> None:
        if not self.symbol(symbol):
            self.fail()

    def fail(self) -> None:
        _, text = self.peek()
        raise ExpressionError(f'Syntax error; token: "{text}", near: "{text}"')

    def done(self) -> None:
        if self.position != len(self.tokens):
            self.fail()

    # Conditions.
    def condition(self) -> Node:
        node = self.conjunction()
        while self.keyword("OR"):
            node = Logical("OR", node, self.conjunction())
        return node

    def conjunction(self) -> Node:
        node = self.negation()
        while self.keyword("AND"):
            node = Logical("AND", node, self.negation())
        return node

    def negation(self) -> Node:
        if self.keyword("NOT"):
            return Not(self.negation())
        return self.predicate()

    def predicate(self) -> Node:
        if self.symbol("("):
            node = self.condition()
            self.expect(")")
            return node
        kind, text = self.peek()
        if kind == "word" and text in CONDITION_FUNCTIONS and self.peek(1) == ("symbol", "("):
            return self.call(CONDITION_FUNCTIONS)
        left = self.operand()
        if self.keyword("BETWEEN"):
            low = self.operand()
            if not self.keyword("AND"):
                self.fail()
            return Between(left, low, self.operand())
        if self.keyword("IN"):
            self.expect("(")
            options = [self.operand()]
            while self.symbol(","):
                options.append(self.operand())
            self.expect(")")
            return In(left, tuple(options))
        kind, text = self.peek()
        if kind == "symbol" and text in COMPARATORS:
            self.position += 1
            return Compare(text, left, self.operand())
        self.fail()
        raise AssertionError  # unreachable: fail() raises

    def operand(self) -> Node:
        kind, text = self.peek()
        if kind == "value":
            self.position += 1
            self.values.add(text)
            return Placeholder(text)
        if kind == "word" and text in OPERAND_FUNCTIONS and self.peek(1) == ("symbol", "("):
            return self.call(OPERAND_FUNCTIONS)
        return self.path()

    def call(self, allowed: frozenset[str]) -> Call:
        _, name = self.peek()
        if name not in allowed:
            raise ExpressionError(f"Invalid function name; function: {name}")
        self.position += 2  # the name and "("
        args = [self.update_operand() if name in UPDATE_FUNCTIONS else self.operand()]
        while self.symbol(","):
            args.append(self.update_operand() if name in UPDATE_FUNCTIONS else self.operand())
        self.expect(")")
        if len(args) != _ARITY[name]:
            raise ExpressionError(
                f"Incorrect number of operands for operator or function; operator or function: {name}"
            )
        if name in ("attribute_exists", "attribute_not_exists", "size", "if_not_exists") and not isinstance(
            args[0], Path
        ):
            raise ExpressionError(f"Operator or function requires a document path; operator or function: {name}")
        return Call(name, tuple(args))

    def path(self) -> Path:
        parts: list[PathPart] = [self.path_name()]
        while True:
            if self.symbol("."):
                parts.append(self.path_name())
            elif self.symbol("["):
                kind, text = self.peek()
                if kind != "number":
                    self.fail()
                self.position += 1
                self.expect("]")
                parts.append(int(text))
            else:
                return Path(tuple(parts))

    def path_name(self) -> str:
        kind, text = self.peek()
        if kind == "name":
            self.names.add(text)
        elif kind != "word":
            self.fail()
        elif text.upper() in RESERVED_WORDS:
            raise ExpressionError(f"Attribute name is a reserved keyword; reserved keyword: {text}")
        self.position += 1
        return text

    # Updates.
    def update(self) -> tuple[UpdateAction, ...]:
        actions: list[UpdateAction] = []
        seen: set[str] = set()
        while self.position < len(self.tokens):
            kind, text = self.peek()
            clause = text.upper()
            if kind != "word" or clause not in CLAUSES:
                self.fail()
            if clause in seen:
                raise ExpressionError(f'The "{clause}" section can only be used once in an update expression;')
            seen.add(clause)
            self.position += 1
            actions.append(self.action(clause))
            while self.symbol(","):
                actions.append(self.action(clause))
        if not actions:
            raise ExpressionError("The expression can not be empty;")
        return tuple(actions)

    def action(self, clause: str) -> UpdateAction:
        path = self.path()
        if clause == "REMOVE":
            return UpdateAction(clause, path, None)
        if clause == "SET":
            self.expect("=")
            left = self.update_operand()
            kind, text = self.peek()
            if kind == "symbol" and text in ("+", "-"):
                self.position += 1
                left = Arithmetic(text, left, self.update_operand())
            return UpdateAction(clause, path, left)
        kind, text = self.peek()
        if kind != "value":
            self.fail()
        self.position += 1
        self.values.add(text)
        return UpdateAction(clause, path, Placeholder(text))

    def update_operand(self) -> Node:
        kind, text = self.peek()
        if kind == "word" and text in UPDATE_FUNCTIONS and self.peek(1) == ("symbol", "("):
            return self.call(UPDATE_FUNCTIONS)
        if kind == "value":
            self.position += 1
            self.values.add(text)
            return Placeholder(text)
        return self.path()

    # Projections.
    def projection(self) -> tuple[Path, ...]:
        paths = [self.path()]
        while self.symbol(","):
            paths.append(self.path())
        return tuple(paths)


def _parse(text: str, rule: str) -> Parsed:
    if not text.strip():
        raise ExpressionError("The expression can not be empty;")
    parser = _Parser(text)
    root: object = getattr(parser, rule)()
    parser.done()
    return Parsed(root, frozenset(parser.names), frozenset(parser.values))


@lru_cache(maxsize=4096)
def parse_condition(text: str) -> Parsed:
    """A ConditionExpression, FilterExpression or KeyConditionExpression."""
    return _parse(text, "condition")


@lru_cache(maxsize=4096)
def parse_update(text: str) -> Parsed:
    """An UpdateExpression: SET, REMOVE, ADD and DELETE clauses, each at most once, in any order."""
    return _parse(text, "update")


@lru_cache(maxsize=4096)
def parse_projection(text: str) -> Parsed:
    """A ProjectionExpression: document paths separated by commas."""
    return _parse(text, "projection")
