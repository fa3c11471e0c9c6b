"""MATH (Hendrycks et al.): train on the 12,000-problem split, evaluate on MATH-500.

Data (see `rapid.tasks.datasets` for the order of sources): `math/train_12k.jsonl` (the 7,500
train problems plus the 4,500 test problems outside MATH-500, as in PRM800K) and
`math500/test.jsonl`; on the Hub `zzy1123/MATH_train_test_split@train` (the same 12k split) and
`HuggingFaceH4/MATH-500@test`. Records whose answer is empty are dropped (two in the 12k split);
the count is printed and kept in `DROPPED`.

Grading reads the final answer into mathematical objects by a strict grammar (`rapid.tasks.math_answer`)
and compares the objects; anything the grammar does not read scores 0. Nothing is stripped before
the comparison except presentation, so nothing stripped can carry a wrong answer. The rules:

0. The answer and its bounds. The answer is the content of the LAST `\\boxed{...}` (or `\\fbox{}`,
   or `\\boxed 9`) of the completion; no box, a box inside the box, or a last box inside another box
   scores 0. Over MAX_ANSWER_CHARS it scores 0 unread; every pattern runs in linear time; numbers too
   large to write out (`10^{10^{10}}`, `9^{99999}`, `(10^{4})!`) score 0 without sympy; sympy runs in a
   child process with an address-space limit, and all the sympy checks of one grade share one time
   limit (`grading.timeout_s`; over it `GradingError` is raised, scored 0 and counted by
   `rapid.rewards.score`).
1. Presentation (`math_answer.normalize`): spacing, `\\left`/`\\right`, `\\dfrac`, `$`, a unicode
   minus, `\\frac12`, thousands marks (`1{,}000`, `10,\\!080`); `%`, `^\\circ` become the units percent
   and degrees. The same spelling as the gold's (text wrappers aside) scores.
2. Answers in words. A gold of choice letters (`(C)`, `\\text{A, C}`), of words in `\\text{}`
   (`\\text{Evelyn}`) or of capitals (`CBAD`) is compared as text, case aside: a choice is one letter,
   `\\text{C or D}` is not `C`, and `DCBA` is not `CBAD` (never a product of symbols).
3. Values. An answer is cut into values at top-level commas and semicolons and at the joiners `and`,
   `or` (`\\text{ or }`); `a \\pm b` is the two values a + b and a - b. It must give as many values as
   the gold: a hedge (`3 or 4` where one value is asked) scores 0. Inside brackets a comma belongs to a
   tuple, interval, set or matrix, and a word (`(3 \\text{ or } 4)`) is an error. Values are matched one
   to one: in any order when the problem asks for all solutions, roots, zeros, possible values or a
   list (naming no order such as "in increasing order"); in the gold's order otherwise. A gold set
   `\\{4,5,7\\}` takes the list `4, 5, 7`, and unordered gold values take a set. `1,234` is one number
   when the gold is one value; a gold `70,110` is two values when the problem asks for answers
   separated by commas. More than MAX_ITEMS values score 0.
4. One value is one object of the grammar (`math_answer`): a number, an expression, an interval, a
   tuple, a set, a matrix, or a relation between them; every token must be read, or the value scores 0.
   Two numbers side by side (`5 6`), a number after a letter (`x2`), `==`, an unbraced multi-digit
   exponent (`2^10`), an unknown command (`\\approx` unless the gold's, `\\ge`, `\\sout`, `\\tag`), a
   qualifier (`?`, `\\ldots`, `maybe`) or a line break are not read. Rational values (integers, decimals,
   fractions, mixed numbers `2\\frac12`, integer powers, roots of perfect powers) compare exactly, a
   decimal as the fraction it spells (`0.333333` is not 1/3); the odd root of a negative number is its
   real root (`\\sqrt[3]{-8}` = -2). Objects compare only with objects of their kind (`\\{4\\}` and
   `[4, 4]` are not 4), and tuples, intervals, sets, matrices and ratios element by element. Anything
   else goes to math-verify (sympy) as the grammar renders it (decimals as exact fractions, capitals
   kept apart from lower case), and a numeric match must be confirmed by sympy's `equals`. A numeral
   with a base (`1011_2`) equals only the same digits in the same base. A gold the grammar does not
   read (a date in `\\text{}`, `\\phantom`) is matched by its spelling only.
5. Units. Text after a value (`\\text{ cm}`, `cm^2`, `\\text{ square feet}`), a leading `\\$`, a percent or
   degree sign is its unit. A value may carry no unit, the gold's unit (`in`, `inches` and `\\text{ inches}`
   are one unit), or, where the gold has none, a unit the question asks for (the words after "how
   many" or of an "in ..." phrase, the percent, degree or dollar marks where the question uses them),
   never a magnitude or hedge word (`million`, `dozen`, `half`, `more`) the question's phrase holds. Any
   other text (another unit, `etc.`, `or more`, `\\text{, 6}`) scores 0.
6. Equations. (a) Against a gold `x = 5` (a name: a letter, `y_1`, `AB`, `f(2)`, `\\angle A`; or `x \\in S`),
   an answer `5` or `x = 5` scores, `y = 5` does not. (b) Against a gold value `5`, `n = 5` scores when
   the problem's formulas use `n`; a chain `2^{10} = 1024` scores only when every side equals the gold:
   a false equation (`2 + 2 = 5`, `x = 1 = 5`) never scores. (c) A gold equation that is not an
   assignment (a curve, a plane) needs an equation, judged by math-verify; a gold inequality needs the
   same relations with equal sides.
"""

from __future__ import annotations

import importlib.util
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass
from fractions import Fraction

from rapid.config import ConfigError
from rapid.tasks import encode_prompts
from rapid.tasks.datasets import load_split, require_fields
from rapid.tasks.grading import SYMBOLIC, GradingError, last_boxed
from rapid.tasks.math_answer import (
    TooLarge,
    check_size,
    exact,
    normalize,
    parse,
    peel_unit,
    plus_minus,
    render,
    same_shape,
    source,
    split,
    tokenize,
    unwrap_text,
)

FILES = {"train": "math/train_12k.jsonl", "test": "math500/test.jsonl"}
# nlile/hendrycks-MATH-benchmark: the 12,000-problem train split of "Let's Verify Step by Step" (MATH minus
# MATH-500), fields problem, solution, answer, subject, level, unique_id, as HuggingFaceH4/MATH-500's
HUB = {"train": "nlile/hendrycks-MATH-benchmark@train", "test": "HuggingFaceH4/MATH-500@test"}
DROPPED: dict[str, int] = {}  # split -> records dropped for an empty answer, by the last load
MAX_ANSWER_CHARS = 1000  # longer boxed answers score 0 unread (the longest reference answer: 159)
MAX_SYMBOLIC_CHARS = 3000  # longer rendered values are not sent to sympy (the longest reference renders to 506)
MAX_ITEMS = 16  # an answer listing more values scores 0 (the most in a reference answer: 8)


def load(split: str, data_path: str | None = None, grading_timeout_s: float = 5.0, **_) -> list[dict]:
    """Records {"problem", "answer", "solution", ..., "grading": {"timeout_s"}} of 'train' or 'test'."""
    if importlib.util.find_spec("math_verify") is None:
        raise ConfigError("grading MATH needs math-verify: pip install math-verify")
    records = []
    loaded = load_split("math", split, FILES, HUB, data_path)
    require_fields(loaded, ("problem",), "math")
    for r in loaded:
        answer = r.get("answer")
        if answer is None:  # sources without the field: derive it
            answer = last_boxed(str(r.get("solution", ""))) or ""
        answer = answer if isinstance(answer, str) else str(answer)
        records.append({**r, "answer": answer, "grading": {"timeout_s": grading_timeout_s}})
    kept = [r for r in records if r["answer"].strip()]
    DROPPED[split] = len(records) - len(kept)
    if DROPPED[split]:
        print(f"math: dropped {DROPPED[split]} of {len(records)} {split} records with an empty answer")
    return kept


def build_prompts(
    records: list[dict], tokenizer, system: str = "", use_chat_template: bool = True, **_
) -> list[list[int]]:
    """The problem as the user turn (or 'Problem: ...\\nSolution:' without a chat template)."""
    return encode_prompts(
        [r["problem"] for r in records], tokenizer, system, use_chat_template, plain_format="Problem: {text}\nSolution:"
    )


def reward(completion: str, record: dict) -> float:
    """1.0 if the last \\boxed{} of `completion` is equivalent to the record's answer, else 0.0."""
    pred = final_answer(completion) if isinstance(completion, str) else None
    if pred is None:
        return 0.0
    timeout_s = record.get("grading", {}).get("timeout_s", 5.0)
    return float(is_equiv(pred, str(record["answer"]), timeout_s, str(record.get("problem") or "")))


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")


def final_answer(completion: str) -> str | None:
    """The content of the completion's last box (rule 0), or None: no box, a box inside it, or a last
    box that sits inside another box (`\\boxed{4 \\text{ or } \\boxed{5}}`)."""
    answer = last_boxed(completion)
    if answer is None or re.search(r"\\(?:boxed|fbox)(?![a-zA-Z])", answer):
        return None
    if completion.rfind("\\boxed ") > max(completion.rfind("\\boxed{"), completion.rfind("\\fbox{")):
        return answer  # `\\boxed 9`: one token, nothing inside it
    depth, open_boxes, last_nested = 0, [], False  # one pass: is the last box opened inside another?
    for m in _BOX.finditer(completion):
        token = m.group()
        if token == "}":
            depth -= 1
            if open_boxes and open_boxes[-1] == depth:
                open_boxes.pop()
        elif token == "{":
            depth += 1
        else:
            last_nested = bool(open_boxes)
            open_boxes.append(depth)
            depth += 1
    return None if last_nested else answer


_DEADLINE: ContextVar[float | None] = ContextVar("math_grading_deadline", default=None)


def is_equiv(pred: str, gold: str, timeout_s: float = 5.0, problem: str = "") -> bool:
    """Whether the answer `pred` says what `gold` says, by the rules of the module docstring; `problem`
    (the question's text, optional) tells whether a list is unordered, which units it asks for and how
    to read `70,110`. All the sympy checks of one grade share `timeout_s` (several values may each
    need one); over it, `GradingError`."""
    if _DEADLINE.get() is not None:  # a side of an `\\approx` gold: the same grade
        return _is_equiv(pred, gold, timeout_s, problem)
    token = _DEADLINE.set(time.monotonic() + timeout_s)
    try:
        return _is_equiv(pred, gold, timeout_s, problem)
    finally:
        _DEADLINE.reset(token)


def _is_equiv(pred: str, gold: str, timeout_s: float, problem: str) -> bool:
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:  # rule 0: before any regex
        return False
    p, g = normalize(pred), normalize(gold)
    if not p or not g:
        return False
    if _spelling(p) == _spelling(g):  # rule 1
        return True
    if _is_text_answer(g):  # rule 2
        return _text_equal(p, g, problem)
    if "\\approx" in g:  # a gold `\approx 8.24` or `\frac23 \approx 0.67`: either side, approximated or not
        g_sides = [side.strip() for side in g.split("\\approx") if side.strip()]
        p_sides = [side.strip() for side in p.split("\\approx") if side.strip()]
        if len(p_sides) > 1:  # the gold's statement restated: side by side
            return len(p_sides) == len(g_sides) and all(
                is_equiv(a, b, timeout_s, problem) for a, b in zip(p_sides, g_sides)
            )
        return len(p_sides) == 1 and any(is_equiv(p_sides[0], side, timeout_s, problem) for side in g_sides)
    golds, grouped = _gold_values(g, problem)
    preds = read_values(p, grouped)
    if not golds or not preds:
        return False
    unordered = bool(_UNORDERED.search(problem)) and not _ORDERED.search(problem)
    if len(golds) == 1 and len(preds) > 1 and golds[0].text.startswith("\\{") and not any(v.unit for v in preds):
        preds = read_values(f"\\{{{', '.join(v.text for v in preds)}\\}}", False)  # 4, 5, 7 for the set {4, 5, 7}
    elif len(golds) > 1 and len(preds) == 1 and unordered and preds[0].text.startswith("\\{"):
        inner = preds[0].text[2:-2] if preds[0].text.endswith("\\}") else ""
        preds = read_values(inner, False) or preds  # the set {1, 2} for all solutions 1, 2
    if len(preds) != len(golds):
        return False
    if len(golds) == 1:
        return _value_equal(preds[0], golds[0], timeout_s, problem)
    if not unordered:
        return all(_value_equal(a, b, timeout_s, problem) for a, b in zip(preds, golds))
    return _matched(preds, golds, lambda a, b: _value_equal(a, b, timeout_s, problem))


# --- rule 3: values -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Value:
    """One value of an answer: its tokens (unit removed), their text, and its unit (`\\text{ cm}`, `\\$`)."""

    tokens: tuple
    text: str
    unit: str
    dollar: bool


_GROUPED = re.compile(r"-?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?")  # the whole answer is one grouped number
_UNORDERED = re.compile(
    r"\ball\b|\broots\b|\bsolutions\b|\bzeros\b|possible values|\blist\b|comma|any order|either order", re.I
)
_ORDERED = re.compile(
    r"increasing|decreasing|ascending|descending|(?:least|smallest|lowest|fewest|most|greatest|largest|highest)"
    r"\b[^.?!]{0,40}?\bto (?:the )?(?:least|smallest|lowest|fewest|most|greatest|largest|highest)\b",
    re.I,
)


def read_values(s: str, grouped: bool = True) -> list[Value] | None:
    """The values of a normalized answer, in order (rule 3), or None if it has none, more than
    MAX_ITEMS, a character outside the grammar or unbalanced brackets. With `grouped`, an answer that is
    one number with thousands separators (`1,234,567`) is one value."""
    if grouped and _GROUPED.fullmatch(s):
        s = s.replace(",", "")
    tokens = tokenize(s)
    items = split(tokens) if tokens else None
    if not items or len(items) > MAX_ITEMS:
        return None
    values = []
    for item in items:
        for part in plus_minus(item):
            body, unit, dollar = peel_unit(part)
            values.append(Value(tuple(body), source(body), unit, dollar))
    return values if len(values) <= MAX_ITEMS else None


def _gold_values(gold: str, problem: str) -> tuple[list[Value] | None, bool]:
    """(the gold's values, whether the answer's commas may group thousands). `70,110` is one number or two
    values; it is two when the problem asks for answers separated by commas."""
    grouped = not (_GROUPED.fullmatch(gold) and re.search(r"\bcomma", problem, re.I))
    values = read_values(gold, grouped)
    return values, grouped and values is not None and len(values) == 1


# --- rules 4-6: one value against another -----------------------------------------------------------
_NUMERAL = re.compile(r"(-?[0-9A-Z]+(?:\.[0-9A-Z]+)?)_\{?([0-9]+)\}?")  # 1011_2: a numeral in a base
_GREEK = r"\\(?:alpha|beta|gamma|delta|theta|phi|lambda|mu|omega|rho|sigma|tau)"
_NAME = re.compile(
    rf"(?:[A-Za-z]|{_GREEK})(?:_\{{?\w+\}}?)?'*(?:\([^()=]*\))?|[A-Z]{{2,3}}|\\angle ?[A-Z]{{1,3}}|m\\angle ?[A-Z]{{1,3}}"
)
_SETS = ("set", "seq", "setop")


def _value_equal(p: Value, g: Value, timeout_s: float, problem: str) -> bool:
    if not _unit_allowed(p, g, problem):  # rule 5
        return False
    if _compact(p.text) == _compact(g.text):
        return True
    numerals = [_NUMERAL.fullmatch(unwrap_text(x.text).replace(" ", "")) for x in (p, g)]
    if any(numerals):  # 12_3 is five, not 12; digits and base must both agree
        return all(numerals) and len({(m.group(1).lstrip("0"), int(m.group(2))) for m in numerals}) == 1
    gt, pt = parse(list(g.tokens)), parse(list(p.tokens))
    if gt is None or pt is None:  # a gold the grammar does not read is matched by its spelling only
        return False
    try:
        check_size(pt)
        return _tree_equal(pt, gt, timeout_s, problem)
    except TooLarge:  # 10^{10^{10}}, 9^{99999}: no reference is such a number
        return False


def _tree_equal(pt, gt, timeout_s: float, problem: str) -> bool:
    """Rule 6: an equation names what it gives; a chain of equalities is true throughout."""
    if "ratio" in (pt[0], gt[0]):  # 3:5 against 3:5, part by part
        return (
            pt[0] == gt[0]
            and len(pt[1]) == len(gt[1])
            and all(_expr_equal(a, b, timeout_s) for a, b in zip(pt[1], gt[1]))
        )
    g_name = g_value = None
    if gt[0] == "rel":
        sides, ops, texts = gt[1], gt[2], gt[3]
        if len(ops) == 1 and ops[0] in ("=", "\\in") and _NAME.fullmatch(texts[0]):
            g_name, g_value = texts[0], sides[1]
        elif pt[0] != "rel" or pt[2] != ops:  # a curve, a plane, an inequality: the same relation
            return False
        elif ops == ("=",):
            return _symbolic(pt, gt, timeout_s)
        else:
            return all(_expr_equal(a, b, timeout_s) for a, b in zip(pt[1], sides))
    else:
        g_value = gt
    if pt[0] != "rel":
        return _expr_equal(pt, g_value, timeout_s)
    sides, ops, texts = pt[1], pt[2], pt[3]
    if _NAME.fullmatch(texts[0]):
        if g_name is not None and _compact(texts[0]) != _compact(g_name):
            return False  # y = 5 against x = 5
        if g_name is None and not _named_in(texts[0], problem):
            return False  # n = 5 where the problem has no n
        if not (set(ops) == {"="} or ops == ("\\in",) and g_value[0] in _SETS):
            return False
        return all(_expr_equal(side, g_value, timeout_s) for side in sides[1:])
    if g_name is not None:  # `2x + 0 = 10` against `x = 5`: compared as equations
        return len(ops) == 1 and ops[0] == "=" and _symbolic(pt, gt, timeout_s)
    return set(ops) == {"="} and all(_expr_equal(side, g_value, timeout_s) for side in sides)


def _named_in(name: str, problem: str) -> bool:
    """Whether the problem's formulas use `name` (any name where the problem has no formulas)."""
    formulas = "".join(re.findall(r"\$([^$]*)\$", problem or ""))
    return not formulas or _compact(name).replace(" ", "") in formulas.replace(" ", "")


def _expr_equal(a, b, timeout_s: float) -> bool:
    """Rule 4: objects of one kind only; exact rationals compare exactly; anything else goes to sympy as
    rendered by the grammar."""
    if not same_shape(a, b):
        return False
    if a[0] == b[0] == "seq":  # tuples and intervals: brackets and elements in order (same_shape: brackets)
        return all(_expr_equal(x, y, timeout_s) for x, y in zip(a[2], b[2]))
    if a[0] == b[0] == "matrix":
        return all(_expr_equal(x, y, timeout_s) for ra, rb in zip(a[1], b[1]) for x, y in zip(ra, rb))
    if a[0] == b[0] == "set" and len(a[1]) == len(b[1]):  # elements one to one, in any order
        return _matched(list(a[1]), list(b[1]), lambda x, y: _expr_equal(x, y, timeout_s))
    if a[0] == b[0] == "setop" and a[1] == b[1] and a[1] != "\\setminus":  # a union of the same parts
        parts = lambda n: _operands(n, n[1])  # noqa: E731
        pa, pb = parts(a), parts(b)
        if len(pa) == len(pb) and _matched(pa, pb, lambda x, y: _expr_equal(x, y, timeout_s)):
            return True
    ea, eb = exact(a), exact(b)
    if ea is not None and eb is not None:
        return ea == eb
    return _symbolic(a, b, timeout_s)


def _operands(node, op: str) -> list:
    """The parts of a union (or intersection) of several parts."""
    if node[0] == "setop" and node[1] == op:
        return _operands(node[2], op) + _operands(node[3], op)
    return [node]


def _matched(preds: list, golds: list, equal) -> bool:
    """Whether the two lists match one to one under `equal`, an equivalence (so greedy is exact)."""
    unmatched = list(preds)
    for g in golds:
        hit = next((i for i, p in enumerate(unmatched) if equal(p, g)), None)
        if hit is None:
            return False
        unmatched.pop(hit)
    return not unmatched


def _symbolic(a, b, timeout_s: float) -> bool:
    names: dict[str, str] = {}
    ra, rb = render(a, names), render(b, names)
    if ra == rb:
        return True
    if max(len(ra), len(rb)) > MAX_SYMBOLIC_CHARS:
        return False
    deadline = _DEADLINE.get()
    left = timeout_s if deadline is None else deadline - time.monotonic()
    try:
        if left <= 0:
            raise GradingError("no time left")
        return SYMBOLIC.equal(rb, ra, left)
    except GradingError:
        raise GradingError(f"math-verify took over {timeout_s:g} s") from None


# --- rule 5: units ----------------------------------------------------------------------------------
_CANONICAL_UNITS = {
    "in": "inch", "inches": "inch", "ft": "foot", "feet": "foot", "yd": "yard", "mi": "mile", "m": "meter",
    "cm": "centimeter", "mm": "millimeter", "km": "kilometer", "sq": "square", "min": "minute", "mins": "minute",
    "hr": "hour", "hrs": "hour", "sec": "second", "secs": "second", "lb": "pound", "lbs": "pound", "oz": "ounce",
    "g": "gram", "gm": "gram", "kg": "kilogram", "usd": "dollar", "mph": "mph", "children": "child",
    "people": "person", "^2": "square", "^3": "cubic",
}  # fmt: skip
_NOT_UNITS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve twenty thirty forty fifty hundred "
    "hundreds thousand thousands million millions billion billions trillion trillions dozen dozens half times "
    "percent degree degrees dollar dollars cent cents or and not no more less least most than about approximately "
    "roughly nearly almost over under etc".split()
)  # words of the question's phrases that change a number's meaning or hedge it; never a unit


_MAGNITUDES = frozenset("hundred thousand million billion trillion dozen".split())


def _unit_key(unit: str, dollar: bool) -> tuple[str, ...]:
    """A unit as sorted canonical words: `\\text{ square inches}`, `in^2` and `sq. in` are one unit."""
    unit = re.sub(r"\b([ap])\.? ?m\b\.?", r"\1m", unit.lower())  # a time of day: p.m., pm
    words = re.findall(r"[a-z]+|\^[23]", unit)
    out = []
    for w in words:
        w = _CANONICAL_UNITS.get(w, w)
        if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return tuple(sorted(out + (["dollar"] if dollar else [])))


def _asked_units(problem: str) -> set[str]:
    """The unit words the question asks its answer in: the words after `how many`/`how much`, of an `in ...`
    phrase ending at a punctuation mark, and the percent, degree and dollar marks where it uses them."""
    text = problem.lower()
    phrases = re.findall(r"\bhow (?:many|much) ([a-z .]{1,60})", text) + re.findall(
        r"\bin ([a-z ]{1,40}?)[,.?;:)]", text
    )
    words = {w for phrase in phrases for w in _unit_key(phrase, False)} - _NOT_UNITS
    marks = {"percent": r"percent|\\%|%", "degree": r"degree|\\circ", "dollar": r"dollar|\\\$", "cent": r"\bcents?\b"}
    return words | {unit for unit, mark in marks.items() if re.search(mark, text)}


def _unit_allowed(p: Value, g: Value, problem: str) -> bool:
    """A value may carry no unit, the gold's unit, or (where the gold has none) the unit the question asks
    for; any other text scores 0."""
    pu, gu = _unit_key(p.unit, p.dollar), _unit_key(g.unit, g.dollar)
    if not pu:  # a unit may be left out, a magnitude may not: 5 is not `5 \\text{ million}`
        return not set(gu) & _MAGNITUDES
    if gu:
        return pu == gu  # another unit than the gold's: 0
    return set(pu) <= _asked_units(problem)


# --- rule 2: answers in words -----------------------------------------------------------------------
_CHOICES = re.compile(r"\(?[A-Z]\)?(?: ?[,;] ?\(?[A-Z]\)?)*")
_CHOICE = re.compile(r"\(?([A-Z])\)?")
_PROSE = re.compile(r"[A-Za-z(][A-Za-z ,()'.]*")


def _is_text_answer(gold: str) -> bool:
    """A gold in words: choice letters (`(C)`, `\\text{A, C}`), a name or a word in `\\text{}`, capitals (`CBAD`)."""
    plain = unwrap_text(gold).strip()
    return bool(
        _CHOICES.fullmatch(plain) or "\\text{" in gold and _PROSE.fullmatch(plain) or re.fullmatch(r"[A-Z]{2,}", plain)
    )


def _text_equal(p: str, g: str, problem: str) -> bool:
    """Words compare as words, case aside; a choice is one letter; a list of them by rule 3's order."""
    pw, gw = unwrap_text(p).strip(), unwrap_text(g).strip()
    if not _PROSE.fullmatch(pw) or "\\" in pw:
        return False
    preds = [x.strip().removesuffix(".").strip() for x in re.split(r"[,;]", pw)]
    golds = [x.strip().removesuffix(".").strip() for x in re.split(r"[,;]", gw)]
    if len(preds) != len(golds) or not all(preds):
        return False

    def same(a: str, b: str) -> bool:
        choice = _CHOICE.fullmatch(b)
        if choice:
            picked = _CHOICE.fullmatch(a)
            return bool(picked) and picked.group(1) == choice.group(1)
        return " ".join(a.lower().split()) == " ".join(b.lower().split())

    if not (_UNORDERED.search(problem) and not _ORDERED.search(problem)):
        return all(same(a, b) for a, b in zip(preds, golds))
    return _matched(preds, golds, same)


# --- spelling and numbers ---------------------------------------------------------------------------
def _compact(s: str) -> str:
    """`s` without spaces, except between two letters or digits (`5 6` stays two numbers)."""
    return re.sub(r"(?<![0-9A-Za-z]) +| +(?![0-9A-Za-z])", "", s)


def _spelling(s: str) -> str:
    """The answer as written, text wrappers and spacing aside (rule 1: the same spelling scores)."""
    return _compact(unwrap_text(s)).strip()


def exact_number(s: str) -> Fraction | None:
    """The exact value of an answer that is a rational number (`2\\frac12`, `2^{10}`, `\\frac{3}{4}`,
    `0.25`, `\\sqrt[3]{-8}`), else None (also for numbers too large to write out); never raises."""
    if len(s) > MAX_ANSWER_CHARS:
        return None
    tokens = tokenize(normalize(s))
    tree = parse(tokens) if tokens else None
    try:
        return None if tree is None else exact(tree)
    except TooLarge:
        return None


def reference(record: dict) -> tuple[str, str]:
    """(the reference solution, which must score 1; the same ending in a box no answer equals, which must score 0)."""
    return record.get("solution") or f"\\boxed{{{record['answer']}}}", "The answer is \\boxed{\\text{none of these}}."
