"""The strict grammar of a MATH final answer: a boxed answer is read into exactly one mathematical object
per value, or into nothing.

`normalize` rewrites presentation only (spacing, `\\left`, `\\dfrac`, thousands marks, `$`); it never drops
a word or a symbol. `tokenize` cuts the answer into tokens and refuses any character it does not know.
`split` cuts the tokens into values at top-level commas, semicolons and the joiners `and` / `or` (inside
brackets a comma belongs to a tuple, an interval, a set or a matrix, and a word is an error). `peel_unit`
takes a leading `\\$` and trailing text (`\\text{ cm}`, `cm^2`, a percent or degree sign) off a value as
its unit; the caller decides whether that unit is allowed. `parse` reads what is left by the grammar below
and returns a tree, or None when any token is left over or out of place:

    value    := side (relation side)* | side (: side)+      relation: = < > \\le \\ge \\ne \\in; 3:5 a ratio
    side     := sum ((\\cup | \\cap | \\setminus) sum)*
    sum      := [+|-] term ((+|-) term)*
    term     := factor ((* | \\cdot | \\times | / | \\div) factor | factor)*   juxtaposition: no two numbers
    factor   := [+|-] factor | power
    power    := postfix [^ group]                 postfix: primary [!]
    primary  := number | mixed number | letter [_ sub] | letters (a product) | \\frac{}{} | \\sqrt[n]{}
              | \\binom{}{} | function | ( sides ) | [ sides ] | { side } | \\{ sides \\} | |sum| | \\lfloor sum \\rfloor | matrix | constant
    (inside brackets, braces, arguments and matrices a side: never a relation such as `(x = 4)`)

Every tree is rendered back to LaTeX by `render` from a small set of constructs that math-verify reads
completely, so nothing the grammar did not read reaches the symbolic check; `exact` evaluates a tree
to an exact rational where it is one (roots of perfect powers included, the real odd root of a negative
number among them), and `TooLarge` is raised for numbers too large to write out."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

MAX_DEPTH = 60  # parser nesting (sums, signs, primaries); the deepest reference answer reaches 8
MAX_POWER_BITS = 10_000  # 2^{10} is written out; 10^{10^{10}} is too large to compare
MAX_FACTORIAL = 3000  # 2004! is in a reference answer
MAX_EXPONENT = 10_000  # x^{2016} is read; x^{10^{9}} is too large to compare


class TooLarge(ValueError):
    """A number in the answer is too large to write out (a tower of powers, a huge factorial)."""


class Unreadable(ValueError):
    """The answer does not parse by the grammar."""


DEGREES = "\\text{ degrees}"  # what `^\\circ` becomes: a unit after a value, an angle inside a function


# --- presentation -----------------------------------------------------------------------------------
_TEXT_WRAPPERS = r"text|mbox|textnormal|textrm|textup|textbf|textit|textsf|mathrm"
_FONT_WRAPPERS = r"mathbf|boldsymbol|bm|mathit|mathsf|mathnormal"


def normalize(answer: str) -> str:
    """The answer with presentation rewritten to one spelling, in time linear in its length; no word
    and no symbol of it is dropped."""
    s = answer.replace("\u2212", "-").replace("~", " ")
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"(?<=[0-9])(?:\{ ?, ?\}|,\s?\\!\s?|\\,)(?=[0-9]{3}(?![0-9]))", "", s)  # 1{,}000, 10,\!080, 10\,000
    s = s.replace("\\!", "")
    s = re.sub(r"\\[dtc]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\[dt]binom(?![a-zA-Z])", r"\\binom", s)
    s = re.sub(r"\\(?:left|right|displaystyle|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\hspace\*?\{[^{}]*\}", " ", s)
    s = re.sub(r"(?<!\\)\\(?:,|;|:| |quad|qquad|[a-z]*space|hfill)(?![a-zA-Z])", " ", s)
    s = re.sub(r"\^ ?(?:\{ ?\\circ ?\}|\\circ)|\\circ(?![a-zA-Z])", DEGREES.replace("\\", "\\\\"), s)
    s = re.sub(r"\\?%", r"\\text{ percent}", s)
    s = re.sub(r"(?<!\\)\$", "", s)
    s = re.sub(rf"\\(?:{_TEXT_WRAPPERS}) ?\{{", r"\\text{", s)
    s = re.sub(rf"\\(?:{_FONT_WRAPPERS}) ?\{{([^{{}}]*)\}}", r"{\1}", s)
    s = re.sub(r"\\frac ?([0-9]) ?([0-9])", r"\\frac{\1}{\2}", s)  # \frac12, \frac 3 8
    s = re.sub(r"\\frac ?([0-9]) ?\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\} ?([0-9])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt ?([0-9]|[a-zA-Z](?![a-zA-Z]))", r"\\sqrt{\1}", s)  # \sqrt2
    s = re.sub(r"(?<![0-9}])\.([0-9])", r"0.\1", s)  # .5
    s = re.sub(r"\s+", " ", s).strip()
    while s and s[-1] in ".," and not s.endswith("\\."):  # a sentence's full stop, `\text{(E)},`
        s = s[:-1].rstrip()
    return s


def unwrap_text(s: str) -> str:
    """`s` with its `\\text{...}` wrappers removed (for spelling and for answers in words)."""
    return re.sub(r"\\text\{([^{}]*)\}", r"\1", s)


# --- tokens -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tok:
    kind: str  # num, word (a run of letters), cmd, text (a \\text{...}), op
    value: str
    space: bool  # whether whitespace came before it


_TOKEN = re.compile(
    r"(?P<space>\s+)|(?P<num>[0-9]+(?:\.[0-9]+)?)|(?P<text>\\text\{[^{}]*\})"
    r"|(?P<cmd>\\[a-zA-Z]+|\\[{}$|])|(?P<word>[A-Za-z]+)|(?P<op>\\\\|[-+*/^_=()\[\]{},;|!'&<>:])"
)
_NUMBER_TEXT = re.compile(r" ?-?[0-9]+(?:\.[0-9]+)? ?")


def tokenize(s: str) -> list[Tok] | None:
    """The tokens of a normalized answer, or None if it holds a character outside the grammar."""
    out, pos, space = [], 0, False
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None:
            return None
        pos = m.end()
        kind = m.lastgroup
        if kind == "space":
            space = True
            continue
        value = m.group()
        if kind == "text" and _NUMBER_TEXT.fullmatch(value[6:-1]):  # \text{13}: a number
            for sub in tokenize(value[6:-1].strip()) or []:
                out.append(Tok(sub.kind, sub.value, space or sub.space))
                space = False
            continue
        if kind == "cmd" and value == "\\ ":
            space = True
            continue
        out.append(Tok(kind, value, space))
        space = False
    return out


def source(tokens: list[Tok]) -> str:
    """The tokens written back as text (spaces kept where they were)."""
    return "".join((" " if t.space and i else "") + t.value for i, t in enumerate(tokens))


# --- values -----------------------------------------------------------------------------------------
JOINERS = frozenset({"and", "or"})
_OPEN = {"(", "[", "{", "\\{", "\\lfloor", "\\lceil"}
_CLOSE = {")", "]", "}", "\\}", "\\rfloor", "\\rceil"}


def _text_words(tok: Tok) -> list[str]:
    return re.findall(r"[A-Za-z]+|[^\sA-Za-z]", tok.value[6:-1]) if tok.kind == "text" else []


def is_joiner(tok: Tok) -> bool:
    """`and`, `or`, `\\text{ or }`, `\\text{, and }`: a separator between values."""
    if tok.kind == "word":
        return tok.value.lower() in JOINERS
    words = _text_words(tok)
    return bool(words) and any(w.lower() in JOINERS for w in words) and set(w.lower() for w in words) <= JOINERS | {","}


def split(tokens: list[Tok]) -> list[list[Tok]] | None:
    """The values of an answer: tokens cut at top-level commas, semicolons and joiners, or None if the
    brackets do not balance or a value is empty."""
    items, depth, current, in_matrix, joined = [], 0, [], 0, False
    for tok in tokens:
        if tok.value == "\\begin":
            in_matrix += 1
        elif tok.value == "\\end":
            in_matrix -= 1
        if tok.value in _OPEN:
            depth += 1
        elif tok.value in _CLOSE:
            depth -= 1
            if depth < 0:
                return None
        if depth == 0 and not in_matrix and (tok.value in (",", ";") and tok.kind == "op" or is_joiner(tok)):
            if current or not (items and is_joiner(tok)) or joined:  # `2, 3, and 4`: one separator
                items.append(current)
            current, joined = [], is_joiner(tok)
            continue
        joined = False
        current.append(tok)
    items.append(current)
    if depth != 0 or any(not item for item in items[1:]):
        return None
    return [item for item in items if item] if items[0] else None


def plus_minus(tokens: list[Tok]) -> list[list[Tok]]:
    """`a \\pm b` (one top-level \\pm) as the two values a + (b) and a - (b)."""
    depth, at = 0, []
    for i, tok in enumerate(tokens):
        depth += tok.value in _OPEN
        depth -= tok.value in _CLOSE
        if depth == 0 and tok.value in ("\\pm", "\\mp"):
            at.append(i)
    if len(at) != 1:
        return [tokens]
    a, b = tokens[: at[0]], tokens[at[0] + 1 :]
    wrapped = [Tok("op", "(", True), *b, Tok("op", ")", False)]
    plus, minus = Tok("op", "+", True), Tok("op", "-", True)
    if not a:
        return [b, [minus, *wrapped]]
    return [[*a, plus, *wrapped], [*a, minus, *wrapped]]


# units: a trailing \text{...}, optionally squared or cubed; bare unit words after a number
_UNIT_WORDS = frozenset(
    "unit units sq square cubic cm centimeter centimeters mm millimeter millimeters km kilometer kilometers m meter "
    "meters in inch inches ft feet foot yd yard yards mi mile miles mph degree degrees dollar dollars cent cents "
    "second seconds sec minute minutes min hour hours hr hrs day days week weeks month months year years pound pounds "
    "lb lbs ounce ounces oz gram grams g kg kilogram kilograms liter liters gallon gallons percent".split()
)


def peel_unit(tokens: list[Tok]) -> tuple[list[Tok], str, bool]:
    """(the value's tokens without its unit, the unit's text, whether the value began with `\\$`)."""
    dollar = False
    head = 1 if tokens and tokens[0].value == "-" else 0
    if len(tokens) > head and tokens[head].value == "\\$":
        tokens, dollar = tokens[:head] + tokens[head + 1 :], True
    end, unit = len(tokens), []
    angles = any(t.kind == "cmd" and t.value[1:] in _FUNCTIONS for t in tokens)  # \sin 30^\circ: no unit
    while end > 0 and not (angles and tokens[end - 1].value == DEGREES):
        tok = tokens[end - 1]
        if end >= 3 and tok.kind == "num" and tok.value in ("2", "3") and tokens[end - 2].value == "^":
            if tokens[end - 3].kind == "text" or tokens[end - 3].kind == "word" and unit_is_word(tokens[end - 3]):
                unit = ["^" + tok.value] + unit
                end -= 2
                continue
        if tok.kind == "text" and _UNIT_TEXT.fullmatch(tok.value[6:-1]) and not is_joiner(tok):
            unit = [tok.value[6:-1]] + unit
            end -= 1
        elif tok.kind == "word" and unit_is_word(tok) and end > 1:
            unit = [tok.value] + unit
            end -= 1
        else:
            break
    return tokens[:end], " ".join(unit), dollar


_UNIT_TEXT = re.compile(r" ?[A-Za-z][A-Za-z .']*")  # words only: `\text{, 6}`, `\text{ (6)}` are no unit


def unit_is_word(tok: Tok) -> bool:
    """A bare unit word (`cm`, `feet`): two letters or more, so that `3m` stays a product."""
    return len(tok.value) > 1 and tok.value.lower() in _UNIT_WORDS


# --- the grammar ------------------------------------------------------------------------------------
_FUNCTIONS = frozenset("sin cos tan sec csc cot arcsin arccos arctan sinh cosh tanh log ln exp".split())  # \sin x
_APPLIED = frozenset("gcd lcm max min".split())  # \gcd(a, b): parentheses needed
_GREEK = frozenset(
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma tau "
    "upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega".split()
)
_RELATIONS = {"=": "=", "<": "<", ">": ">", "\\le": "\\le", "\\leq": "\\le", "\\ge": "\\ge", "\\geq": "\\ge"}
_RELATIONS |= {"\\ne": "\\ne", "\\neq": "\\ne", "\\in": "\\in", "\\lt": "<", "\\gt": ">"}
_SET_OPS = {"\\cup": "\\cup", "\\cap": "\\cap", "\\setminus": "\\setminus"}
_TIMES = {"*", "\\cdot", "\\times"}
_DIVIDE = {"/", "\\div"}
_CONSTANTS = {"\\pi": ("const", "pi"), "\\infty": ("const", "infty"), "\\emptyset": ("set", ())}
_CONSTANTS["\\varnothing"] = ("set", ())


def parse(tokens: list[Tok]):
    """The tree of one value, or None if the tokens are not exactly one value of the grammar."""
    parser = _Parser(tokens)
    try:
        tree = parser.value()
        if parser.pos != len(tokens):
            return None
        return tree
    except (Unreadable, IndexError, RecursionError):
        return None


class _Parser:
    def __init__(self, tokens: list[Tok]):
        self.t, self.pos, self.depth = tokens, 0, 0

    def peek(self, ahead: int = 0) -> Tok | None:
        i = self.pos + ahead
        return self.t[i] if i < len(self.t) else None

    def at(self, *values: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.value in values and tok.kind in ("op", "cmd")

    def take(self, value: str | None = None) -> Tok:
        tok = self.peek()
        if tok is None or value is not None and (tok.value != value or tok.kind not in ("op", "cmd")):
            raise Unreadable(f"expected {value}")
        self.pos += 1
        return tok

    def enter(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Unreadable("too deep")

    # value := side (relation side)*
    def value(self):
        sides, ops, texts = [], [], []
        start = self.pos
        sides.append(self.side())
        texts.append(source(self.t[start : self.pos]))
        if self.at(":"):  # a ratio or a time of day, 3:5, 4:51:06: its parts in order
            while self.at(":"):
                self.take()
                sides.append(self.side())
            return ("ratio", tuple(sides))
        while self.peek() is not None and self.peek().value in _RELATIONS and self.peek().kind in ("op", "cmd"):
            op = _RELATIONS[self.take().value]
            if op == "=" and self.at("="):
                raise Unreadable("==")
            ops.append(op)
            start = self.pos
            sides.append(self.side())
            texts.append(source(self.t[start : self.pos]))
        return sides[0] if not ops else ("rel", tuple(sides), tuple(ops), tuple(texts))

    def side(self):
        left = self.sum()
        while self.at(*_SET_OPS):
            op = _SET_OPS[self.take().value]
            left = ("setop", op, left, self.sum())
        return left

    def sum(self):
        self.enter()
        terms = []
        sign = self.take().value if self.at("+", "-") else "+"
        term = self.term()
        terms.append(("neg", term) if sign == "-" else term)
        while self.at("+", "-"):
            sign = self.take().value
            term = self.term()
            terms.append(("neg", term) if sign == "-" else term)
        self.depth -= 1
        return terms[0] if len(terms) == 1 else ("add", tuple(terms))

    def term(self):
        left = self.factor()
        while True:
            if self.at(*_TIMES):
                self.take()
                left = ("mul", (left, self.factor()))
            elif self.at(*_DIVIDE):
                self.take()
                left = ("div", left, self.factor())
            elif self.starts_primary(self.peek()) and self.juxtaposable(self.t[self.pos - 1], self.peek()):
                left = ("mul", (left, self.power()))
            else:
                return left

    def factor(self):
        if self.at("-", "+"):
            self.enter()
            sign = self.take().value
            inner = self.factor()
            self.depth -= 1
            return ("neg", inner) if sign == "-" else inner
        return self.power()

    def power(self):
        base = self.primary()
        while self.at("!"):
            self.take()
            base = ("fact", base)
        if self.peek() is not None and self.peek().value == DEGREES:  # an angle inside an expression
            self.take()
            return ("mul", (base, ("div", ("const", "pi"), ("num", "180"))))
        if self.at("^"):
            self.take()
            base = ("pow", base, self.group())
            if self.at("^"):
                raise Unreadable("double superscript")
            while self.at("!"):
                raise Unreadable("factorial of a power")
        return base

    def group(self):
        """A superscript, subscript or argument: {sum} or one token (one digit, letter or constant)."""
        if self.at("{"):
            self.take("{")
            inner = self.side()
            self.take("}")
            return inner
        tok = self.take()
        if tok.kind == "num" and len(tok.value) == 1:
            return ("num", tok.value)
        if tok.kind == "word" and len(tok.value) == 1:
            return ("sym", tok.value)
        if tok.kind == "cmd" and (tok.value in _CONSTANTS or tok.value[1:] in _GREEK):
            return _CONSTANTS.get(tok.value) or ("sym", tok.value)
        raise Unreadable("ambiguous superscript")  # 2^10: is it 2^{10} or 2^1 0?

    @staticmethod
    def starts_primary(tok: Tok | None) -> bool:
        if tok is None:
            return False
        if tok.kind == "num":
            return True
        if tok.kind == "word":
            return tok.value.lower() not in JOINERS
        if tok.kind == "cmd":
            name = tok.value[1:]
            return (
                name in ("frac", "sqrt", "binom", "lfloor", "lceil", "overline", "angle", "triangle", "{")
                or name in _FUNCTIONS
                or name in _APPLIED
                or name in _GREEK
                or tok.value in _CONSTANTS
            )
        return tok.value in ("(", "{", "|")

    @staticmethod
    def juxtaposable(prev: Tok, nxt: Tok) -> bool:
        """Implicit multiplication: never two numbers (`5 6`), never a number after a letter (`x2`)."""
        if nxt.kind == "num":
            return False
        if nxt.value == "|":
            return False  # |a||b| is ambiguous
        return prev.value not in ("(",)

    def primary(self):
        self.enter()
        tok = self.take()
        k, v = tok.kind, tok.value
        if k == "num":
            node = ("num", v)
            if self.at("\\frac") and "." not in v:  # 2\frac{1}{2}: a mixed number
                save = self.pos
                self.take()
                num, den = self.braced_integer(), self.braced_integer()
                if num is not None and den is not None:
                    node = ("mixed", v, num, den)
                else:
                    self.pos = save
        elif k == "word" and len(v) == 1:
            node = self.subscripted(v)
        elif k == "word":
            if v.lower() in JOINERS:
                raise Unreadable("a joiner inside a value")
            letters = [("sym", c) for c in v]
            node = ("mul", tuple(letters[:-1]) + (self.subscripted(v[-1]),))
        elif k == "cmd":
            node = self.command(v)
        elif v == "(" or v == "[":
            node = self.bracketed(v)
        elif v == "{":
            node = self.side()
            self.take("}")
        elif v == "|":
            node = ("abs", self.sum())
            self.take("|")
        else:
            raise Unreadable(f"unexpected {v}")
        self.depth -= 1
        return node

    def subscripted(self, name: str):
        if self.at("_"):
            self.take()
            sub = self.group()
            if sub[0] not in ("num", "sym") and not (sub[0] == "mul" and all(x[0] in ("num", "sym") for x in sub[1])):
                raise Unreadable("subscript")
            return ("sym", f"{name}_{{{_flat(sub)}}}")
        return ("sym", name)

    def braced_integer(self) -> str | None:
        if not self.at("{"):
            return None
        tok, close = self.peek(1), self.peek(2)
        if tok is None or tok.kind != "num" or "." in tok.value or close is None or close.value != "}":
            return None
        self.pos += 3
        return tok.value

    def bracketed(self, open_: str):
        items = [self.side()]
        while self.at(","):
            self.take()
            items.append(self.side())
        close = self.take().value
        if close not in (")", "]"):
            raise Unreadable("bracket")
        if len(items) == 1:
            if open_ == "(" and close == ")":
                return items[0]
            raise Unreadable("one value in square brackets")
        return ("seq", open_, tuple(items), close)

    def command(self, v: str):
        name = v[1:]
        if v in _CONSTANTS:
            return _CONSTANTS[v]
        if name in _GREEK:
            return self.subscripted(v)
        if name == "frac":
            return ("div", self.group_required(), self.group_required())
        if name == "binom":
            return ("binom", self.group_required(), self.group_required())
        if name == "sqrt":
            index = None
            if self.at("["):
                self.take()
                index = self.sum()
                self.take("]")
            return ("root", index, self.group_required())
        if name in ("lfloor", "lceil"):
            inner = self.sum()
            self.take("\\r" + name[1:])
            return (name[1:], inner)
        if name == "{":
            items = [] if self.at("\\}") else self.set_element()
            while self.at(","):
                self.take()
                items += self.set_element()
            self.take("\\}")
            return ("set", tuple(items))
        if name in ("overline", "angle", "triangle"):
            label = self.group_required() if name == "overline" else self.label()
            return ("sym", f"\\{name} {_flat(label)}")
        if name in _FUNCTIONS:
            return self.function(name)
        if name in _APPLIED:
            self.take("(")
            args = [self.side()]
            while self.at(","):
                self.take()
                args.append(self.side())
            self.take(")")
            return ("apply", name, tuple(args))
        if name == "begin":
            return self.matrix()
        raise Unreadable(f"unknown command {v}")

    def set_element(self) -> list:
        """One element of a set, or two: `\\{1 \\pm \\sqrt{5}, -2\\}` has three elements."""
        first = self.side()
        if not self.at("\\pm"):
            return [first]
        self.take()
        second = self.side()
        return [("add", (first, second)), ("add", (first, ("neg", second)))]

    def label(self):
        tok = self.take()
        if tok.kind == "word" and tok.value.isupper():
            return ("sym", tok.value)
        raise Unreadable("label")

    def group_required(self):
        if self.at("{"):
            self.take()
            inner = self.side()
            self.take("}")
            return inner
        return self.group()

    def function(self, name: str):
        power = base = None
        if name == "log" and self.at("_"):
            self.take()
            base = self.group()
        if self.at("^"):
            self.take()
            power = self.group()
        if self.at("("):  # \sin(x)
            self.take()
            arg = self.side()
            self.take(")")
        else:  # \sin 3x, \tan \frac{x}{2}: a product of factors, up to the next operator or function
            arg = self.power()
            while self.starts_primary(self.peek()) and not (
                self.peek().kind == "cmd" and self.peek().value[1:] in _FUNCTIONS
            ):
                if not self.juxtaposable(self.t[self.pos - 1], self.peek()):
                    break
                arg = ("mul", (arg, self.power()))
        return ("func", name, base, power, arg)

    def matrix(self):
        self.take("{")
        env = self.take()
        if env.value not in ("pmatrix", "bmatrix", "matrix"):  # not a determinant, not cases
            raise Unreadable("environment")
        self.take("}")
        rows, row = [], [self.side()]
        while True:
            if self.at("&"):
                self.take()
                row.append(self.side())
            elif self.at("\\\\"):
                self.take()
                rows.append(tuple(row))
                if self.at("\\end"):
                    row = None
                    break
                row = [self.side()]
            else:
                break
        if row is not None:
            rows.append(tuple(row))
        self.take("\\end")
        self.take("{")
        if self.take().value != env.value:
            raise Unreadable("environment")
        self.take("}")
        if len({len(r) for r in rows}) != 1:
            raise Unreadable("ragged matrix")
        return ("matrix", tuple(rows))


def _flat(node) -> str:
    """A subscript or label written back (digits and letters only)."""
    if node[0] in ("num", "sym"):
        return node[1]
    return "".join(_flat(x) for x in node[1])


# --- exact values -----------------------------------------------------------------------------------
def exact(node) -> Fraction | None:
    """The exact rational value of a tree, or None if it is not a rational number (a surd, a symbol,
    a tuple); raises TooLarge for a number too large to write out."""
    kind = node[0]
    if kind == "num":
        return Fraction(node[1])
    if kind == "mixed":
        return int(node[1]) + Fraction(int(node[2]), int(node[3])) if int(node[3]) else None
    if kind == "neg":
        value = exact(node[1])
        return None if value is None else -value
    if kind == "add":
        values = [exact(x) for x in node[1]]
        return None if None in values else sum(values, Fraction(0))
    if kind == "mul":
        values = [exact(x) for x in node[1]]
        if None in values:
            return None
        out = Fraction(1)
        for v in values:
            out *= v
        return out
    if kind == "div":
        a, b = exact(node[1]), exact(node[2])
        return None if a is None or b is None or b == 0 else a / b
    if kind == "pow":
        base, exponent = exact(node[1]), exact(node[2])
        if exponent is not None and abs(exponent) > MAX_EXPONENT:
            raise TooLarge("exponent")
        if base is None or exponent is None:
            return None
        return _rational_power(base, exponent)
    if kind == "root":
        index = Fraction(2) if node[1] is None else exact(node[1])
        if index is not None and abs(index) > MAX_EXPONENT:
            raise TooLarge("root")
        radicand = exact(node[2])
        if index is None or radicand is None or index.denominator != 1 or index < 2:
            return None
        return _rational_power(radicand, 1 / index)
    if kind == "fact":
        n = exact(node[1])
        if n is None or n.denominator != 1 or n < 0:
            return None
        if n > MAX_FACTORIAL:
            raise TooLarge("factorial")
        return Fraction(math.factorial(int(n)))
    return None


def _rational_power(base: Fraction, exponent: Fraction) -> Fraction | None:
    """base^exponent when it is rational (an odd root of a negative number is its real root)."""
    p, q = exponent.numerator, exponent.denominator
    if base == 0:
        return None if p < 0 else Fraction(0 if p else 1)
    bits = max(base.numerator.bit_length(), base.denominator.bit_length(), 1)
    if abs(p) * bits > MAX_POWER_BITS * q:
        raise TooLarge("power")
    if base < 0 and q % 2 == 0:
        return None
    root = _exact_root(abs(base), q)
    if root is None:
        return None
    root = -root if base < 0 else root
    return root**p


def _exact_root(x: Fraction, q: int) -> Fraction | None:
    if q == 1:
        return x
    num, den = _integer_root(x.numerator, q), _integer_root(x.denominator, q)
    return None if num is None or den is None else Fraction(num, den)


def _integer_root(n: int, q: int) -> int | None:
    """The integer q-th root of n >= 0 if n is a perfect q-th power, by Newton's method on integers
    (q above n's bit length leaves only 0 and 1, so no power as large as 2^q is ever formed)."""
    if n < 2:
        return n
    if q >= n.bit_length():
        return None
    x = 1 << -(-n.bit_length() // q)  # above the root
    while True:
        y = ((q - 1) * x + n // x ** (q - 1)) // q
        if y >= x:
            return x if x**q == n else None
        x = y


def check_size(node) -> None:
    """Raise TooLarge if any power or factorial in the tree is too large to write out."""
    if node[0] in ("pow", "root", "fact"):
        exact(node)
    for child in _children(node):
        check_size(child)


def _children(node):
    for part in node[1:]:
        if isinstance(part, tuple) and part and isinstance(part[0], str):
            yield part
        elif isinstance(part, tuple):
            for x in part:
                if isinstance(x, tuple) and x and isinstance(x[0], str):
                    yield x
                elif isinstance(x, tuple):  # a matrix row
                    yield from (y for y in x if isinstance(y, tuple))


_CONTAINERS = {"set": "set", "seq": "seq", "setop": "setop", "matrix": "matrix", "ratio": "ratio", "rel": "rel"}


def same_shape(a, b) -> bool:
    """Whether two trees are objects of one kind (numbers and expressions, sets, tuples or intervals,
    matrices of one size...), element by element where order matters: math-verify reads `\\{4\\}` and
    `[4, 4]` as equal to 4, so kinds are settled here before it sees them."""
    ka, kb = _kind(a), _kind(b)
    if "setop" in (ka, kb):  # [1, 2] \cup [2, 3] may equal [1, 3]
        return {ka, kb} <= {"setop", "set", "seq"}
    if ka != kb or ka == "mixed":
        return False
    if ka == "seq":
        return a[1] == b[1] and a[3] == b[3] and len(a[2]) == len(b[2]) and all(map(same_shape, a[2], b[2]))
    if ka == "matrix":
        return (
            len(a[1]) == len(b[1])
            and len(a[1][0]) == len(b[1][0])
            and all(same_shape(x, y) for ra, rb in zip(a[1], b[1]) for x, y in zip(ra, rb))
        )
    if ka in ("ratio", "rel"):
        return len(a[1]) == len(b[1]) and all(map(same_shape, a[1], b[1]))
    return True


def _kind(node) -> str:
    kind = _CONTAINERS.get(node[0])
    if kind is not None:
        return kind
    return "mixed" if any(_kind(child) != "scalar" for child in _children(node)) else "scalar"


# --- rendering --------------------------------------------------------------------------------------
def render(node, names: dict[str, str]) -> str:
    """LaTeX for a tree, from constructs math-verify reads completely. Symbols other than a single
    lowercase letter or a lowercase Greek letter are renamed through `names` (shared by the two sides
    of a comparison), since math-verify reads `A` and `a` as one symbol."""
    kind = node[0]
    r = lambda x: render(x, names)  # noqa: E731
    if kind == "num":
        whole, _, frac = node[1].partition(".")
        return node[1] if not frac else f"\\frac{{{whole}{frac}}}{{1{'0' * len(frac)}}}"
    if kind == "mixed":
        return f"\\left({node[1]}+\\frac{{{node[2]}}}{{{node[3]}}}\\right)"
    if kind == "sym":
        name = node[1]
        if re.fullmatch(r"[a-z]", name) or name[1:] in _GREEK and name[1].islower():
            return name
        return names.setdefault(name, f"v_{{{len(names)}}}")
    if kind == "const":
        return "\\pi" if node[1] == "pi" else "\\infty"
    if kind == "neg":
        return f"-\\left({r(node[1])}\\right)"
    if kind == "add":
        return "+".join(f"\\left({r(x)}\\right)" for x in node[1])
    if kind == "mul":
        return "\\cdot".join(f"\\left({r(x)}\\right)" for x in node[1])
    if kind == "div":
        return f"\\frac{{{r(node[1])}}}{{{r(node[2])}}}"
    if kind == "pow":
        return _render_power(node, names)
    if kind == "root":
        return _render_root(node, names)
    if kind == "fact":
        return f"\\left({r(node[1])}\\right)!"
    if kind == "abs":
        return f"\\left|{r(node[1])}\\right|"
    if kind in ("floor", "ceil"):
        return f"\\l{kind}{r(node[1])}\\r{kind}"
    if kind == "binom":
        return f"\\binom{{{r(node[1])}}}{{{r(node[2])}}}"
    if kind == "func":
        _, name, base, power, arg = node
        head = f"\\{name}" + (f"_{{{r(base)}}}" if base is not None else "")
        out = f"{head}\\left({r(arg)}\\right)"
        return out if power is None else f"\\left({out}\\right)^{{{r(power)}}}"
    if kind == "apply":
        return f"\\{node[1]}\\left({', '.join(r(x) for x in node[2])}\\right)"
    if kind == "seq":
        return f"{node[1]}{', '.join(r(x) for x in node[2])}{node[3]}"
    if kind == "set":
        return "\\emptyset" if not node[1] else f"\\{{{', '.join(r(x) for x in node[1])}\\}}"
    if kind == "setop":
        return f"{r(node[2])} {node[1]} {r(node[3])}"
    if kind == "matrix":
        rows = " \\\\ ".join(" & ".join(r(x) for x in row) for row in node[1])
        return f"\\begin{{pmatrix}} {rows} \\end{{pmatrix}}"
    if kind == "ratio":
        return f"({', '.join(r(x) for x in node[1])})"
    if kind == "rel":
        out = r(node[1][0])
        for op, side in zip(node[2], node[1][1:]):
            out += f" {op} {r(side)}"
        return out
    raise Unreadable(kind)


def _fraction(x: Fraction) -> str:
    return f"\\frac{{{x.numerator}}}{{{x.denominator}}}"


def _render_power(node, names) -> str:
    base, exponent = node[1], node[2]
    b, e = exact(base), exact(exponent)
    if b is not None and b < 0 and e is not None and e.denominator % 2 == 1 and e.denominator > 1:
        sign = "-" if e.numerator % 2 else ""  # the real odd root: (-8)^{1/3} = -2
        return f"{sign}\\left({_fraction(-b)}\\right)^{{{render(exponent, names)}}}"
    return f"\\left({render(base, names)}\\right)^{{{render(exponent, names)}}}"


def _render_root(node, names) -> str:
    index, radicand = node[1], node[2]
    head = "\\sqrt" if index is None else f"\\sqrt[{render(index, names)}]"
    n = None if index is None else exact(index)
    if n is not None and n.denominator == 1 and n % 2 == 1:  # an odd root of a negative number is real
        value = exact(radicand)
        if value is not None and value < 0:
            return f"-{head}{{{_fraction(-value)}}}"
        if radicand[0] == "neg":
            return f"-{head}{{{render(radicand[1], names)}}}"
    return f"{head}{{{render(radicand, names)}}}"
