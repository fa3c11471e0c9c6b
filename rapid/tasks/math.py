"""MATH (Hendrycks et al.): train on the 12,000-problem split, evaluate on MATH-500.

Data (see `rapid.tasks.datasets` for the order of sources): `math/train_12k.jsonl` (the 7,500
train problems plus the 4,500 test problems outside MATH-500, as in PRM800K) and
`math500/test.jsonl`; on the Hub `zzy1123/MATH_train_test_split@train` (the same 12k split) and
`HuggingFaceH4/MATH-500@test`. Records whose answer is empty are dropped (two in the 12k split);
the count is printed and kept in `DROPPED`.

Grading: the answer is the content of the LAST `\\boxed{...}` of the completion (balanced braces;
`\\boxed 9` also counts); no box, no credit. A wrong answer must never score, because an RL policy
finds whatever a grader accepts wrongly. Where graders in the field differ (docs/grading.md), the
stricter rule is taken as long as every reference solution of MATH still scores 1. The rules:

0. Bounded. A boxed answer over MAX_ANSWER_CHARS scores 0 before any regex runs; every pattern
   below runs in time linear in its input; sympy gets at most MAX_SYMBOLIC_CHARS per value, in a
   child process with a time limit (`grading.timeout_s`; over it `GradingError` is raised, scored 0
   and counted by `rapid.rewards.score`) and an address-space limit.
1. Presentation is ignored (`normalize`): `\\text{}` wrappers, units at the end after a number
   (`5 \\text{ cm}`, `3 square feet`; not `\\text{ or 6}`, nor the `\\text{ B}` of `(A) \\text{ B}`),
   `\\%`, `\\$`, `^\\circ`, `\\dfrac`/`\\tfrac`, `\\left`/`\\right`, spacing commands, a unicode minus,
   `\\frac12`/`\\sqrt2` shorthands, and thousands marks that cannot mean a list (`1{,}000`,
   `10,\\!080`, `10\\,000`).
2. One value or several. An answer is split into values at commas and semicolons outside brackets,
   at words that join alternatives (`or`, `and`, `either`, `maybe`, `\\lor`, ...), between
   juxtaposed numbers (`5 6` is two numbers, not 56 or 30), and `a \\pm b` is the two values a + b
   and a - b. The answer must give exactly as many values as the gold: a hedge (`3 or 4`, `3, 4`,
   `(C) or (D)`) where one value is asked scores 0. Several values are matched one to one: in any
   order when the problem asks for all solutions, roots, zeros, possible values or a list (and names
   no order such as "in increasing order"); in the gold's order otherwise. Tuples, intervals,
   sets and matrices are one value (rule 7 keeps their brackets and order); a gold set `\\{4,5,7\\}`
   takes the list `4, 5, 7`, and unordered gold values take a set. `\\ldots`, `?`, `maybe`, `if`
   count as a value of their own (which no gold has), and so does anything after a line break.
3. Numbers are exact. Integers, decimals, fractions, mixed numbers (`2\\frac{1}{2}` = 5/2) and integer
   powers (`2^{10}` = 1024) compare as exact rationals; a decimal is the fraction it spells, so
   `0.333333` is not 1/3, `0.000000` is not 10^{-7} and `1.414214` is not sqrt(2) (math-verify's
   rounding to 6 places is off; a match math-verify finds only numerically, such as sqrt(2) +
   10^{-100}, is confirmed by sympy's `equals`). A numeral with a base (`1011_2`) equals only
   the same digits in the same base (`12_3` is not 12). `1,234` is one number when the gold is one
   value; `1, 234` (comma and space) is two. A gold written `70,110` is two values when the
   problem asks for answers separated by commas, else one number.
4. Words are words. A choice (`(C)`, `\\text{C}`, `C`) equals exactly one choice letter; an answer in
   words (`\\text{Evelyn}`, `\\text{CBAD}`) compares as text, case aside (never as a product of
   symbols, where `ABDC` would equal `CBAD`); a value may not carry words the gold lacks, nor a
   relation (`\\approx` unless the gold is approximate, `\\ge`, `\\to`, `<`, `\\pmod`), nor a
   LaTeX command outside a vocabulary of mathematical ones (`_VOCABULARY`) that the gold does not
   use: markup math-verify skips, such as `\\sout{6} 5`, `\\tag{6}` or `\\hbox{6}`, can hide a
   second value.
5. Equations. (a) Against a gold `x = 5` (a name: a letter, `y_1`, `AB`, `f(2)`, `\\angle A`), an
   answer `5` or `x = 5` scores, `y = 5` does not. (b) Against a gold value `5`, `n = 5` scores (a
   name and the value), and a chain `2^{10} = 1024` scores only when every side equals the gold:
   a false equation (`2 + 2 = 5`, `x = 1 = 5`) never scores. (c) A gold equation that is not an
   assignment (a curve, a plane) needs an equation, judged by math-verify as an equation.
6. Exact spelling of the gold scores (after rule 1) before anything else.
7. Everything else goes to math-verify (sympy) with decimals rewritten as exact fractions: surds,
   expressions, tuples and intervals with their brackets, sets, matrices.
"""

from __future__ import annotations

import importlib.util
import re
from fractions import Fraction

from rapid.config import ConfigError
from rapid.tasks import encode_prompts
from rapid.tasks.datasets import load_split, require_fields
from rapid.tasks.grading import MAX_NUMBER_CHARS, SYMBOLIC, last_boxed, parse_number

FILES = {"train": "math/train_12k.jsonl", "test": "math500/test.jsonl"}
# nlile/hendrycks-MATH-benchmark: the 12,000-problem train split of "Let's Verify Step by Step" (MATH minus
# MATH-500), fields problem, solution, answer, subject, level, unique_id, as HuggingFaceH4/MATH-500's
HUB = {"train": "nlile/hendrycks-MATH-benchmark@train", "test": "HuggingFaceH4/MATH-500@test"}
DROPPED: dict[str, int] = {}  # split -> records dropped for an empty answer, by the last load
MAX_ANSWER_CHARS = 1000  # longer boxed answers score 0 unread (the longest reference answer: 159)
MAX_SYMBOLIC_CHARS = 400  # longer values are not sent to sympy (string compare only)
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
    pred = last_boxed(completion) if isinstance(completion, str) else None
    if pred is None:
        return 0.0
    timeout_s = record.get("grading", {}).get("timeout_s", 5.0)
    return float(is_equiv(pred, str(record["answer"]), timeout_s, str(record.get("problem") or "")))


def is_equiv(pred: str, gold: str, timeout_s: float = 5.0, problem: str = "") -> bool:
    """Whether the answer `pred` says what `gold` says, by the rules of the module docstring; `problem`
    (the question's text, optional) tells whether a list is unordered and how to read `70,110`."""
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:  # rule 0: before any regex
        return False
    p, g = normalize(pred), normalize(gold)
    if not p or not g:
        return False
    if _compact(p) == _compact(g):
        return True
    if not set(_COMMAND.findall(p)) <= _VOCABULARY | set(_COMMAND.findall(g)):
        return False  # markup a grader cannot read (\sout{6} 5, \tag{6}, \color) may hide a value
    golds, grouped = _gold_items(g, problem)
    preds = split_items(p, grouped)
    unordered = bool(_UNORDERED.search(problem)) and not _ORDERED.search(problem)
    if golds and preds and len(golds) == 1 and len(preds) > 1 and _SET.fullmatch(golds[0]):
        preds = [f"\\{{{', '.join(preds)}\\}}"]  # 4, 5, 7 for the set {4, 5, 7}
    elif golds and preds and len(golds) > 1 and len(preds) == 1 and unordered and (inner := _SET.fullmatch(preds[0])):
        preds = split_items(inner.group(1), grouped=False)  # the set {1, 2} for all solutions 1, 2
    if not golds or not preds or len(preds) != len(golds):
        return False
    if len(golds) == 1:
        return _item_equal(preds[0], golds[0], timeout_s)
    if not unordered:
        return all(_item_equal(a, b, timeout_s) for a, b in zip(preds, golds))
    unmatched = list(preds)  # a multiset match; item equality is an equivalence, so greedy is exact
    for item in golds:
        hit = next((i for i, cand in enumerate(unmatched) if _item_equal(cand, item, timeout_s)), None)
        if hit is None:
            return False
        unmatched.pop(hit)
    return True


# --- rule 2: one answer or several ------------------------------------------------------------------
_GROUPED = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")  # the whole answer is one grouped number
_JOINERS = re.compile(r"\b(?:or|and|either|both)\b|\\(?:lor|vee|land|wedge)(?![a-zA-Z])")
_QUALIFIERS = re.compile(  # each stands for a value of its own, which no gold has
    r"\b(?:maybe|perhaps|possibly|probably|otherwise|else|if|unless)\b|\?|\\(?:[lc]?dots|dotsc)(?![a-zA-Z])"
)
_SET = re.compile(r"\\\{(.*)\\\}")
_COMMAND = re.compile(r"\\([a-zA-Z]+)")
_VOCABULARY = frozenset(  # LaTeX commands an answer may use (besides the gold's own; `normalize` unwrapped \text)
    "frac cfrac sqrt pi circ begin end infty cup cap setminus emptyset varnothing in notin subset subseteq "
    "cos sin tan sec csc cot arcsin arccos arctan sinh cosh tanh log ln lg exp max min gcd lcm deg "
    "lfloor rfloor lceil rceil vert lvert rvert mid binom dbinom tbinom choose cdot times div pm mp "
    "le leq ge geq lt gt neq ne approx triangle angle overline hat vec prime mathbb operatorname i "
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma "
    "tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega".split()
)
_LINE_BREAKS = re.compile(r"\\\\|\\(?:newline|cr)(?![a-zA-Z])")
_JUXTAPOSED = re.compile(r"(?<=\d) +(?=\d)")  # "5 6": two numbers, never 56 or 30
_UNORDERED = re.compile(
    r"\ball\b|\broots\b|\bsolutions\b|\bzeros\b|possible values|\blist\b|comma|any order|either order", re.I
)
_ORDERED = re.compile(
    r"increasing|decreasing|ascending|descending|(?:least|smallest|lowest|fewest|most|greatest|largest|highest)"
    r"\b[^.?!]{0,40}?\bto (?:the )?(?:least|smallest|lowest|fewest|most|greatest|largest|highest)\b",
    re.I,
)


def _gold_items(gold: str, problem: str) -> tuple[list[str] | None, bool]:
    """(the gold's items, whether the answer's commas may group thousands). `70,110` is one number or two
    values; it is two when the problem asks for answers separated by commas."""
    grouped = not (_GROUPED.fullmatch(gold) and re.search(r"\bcomma", problem, re.I))
    items = split_items(gold, grouped)
    return items, grouped and (items is not None and len(items) == 1)


def split_items(s: str, grouped: bool = True) -> list[str] | None:
    """The values an answer gives, in order: split at commas and semicolons outside brackets, at words
    that join alternatives (or, and, either, maybe, ...), between juxtaposed numbers, and `a \\pm b`
    into a + b and a - b. With `grouped`, an answer that is one number with thousands separators
    (`1,234,567`) is one value. None if there are more than MAX_ITEMS."""
    if grouped and _GROUPED.fullmatch(s):
        return [s.replace(",", "")]
    if "\\begin" not in s:  # outside a matrix or cases, a line break separates values
        s = _LINE_BREAKS.sub(";", s)
    s = _JUXTAPOSED.sub(",", _JOINERS.sub(",", _QUALIFIERS.sub(",?,", s)))
    items, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c in ",;" and depth == 0:
            items.append(s[start:i])
            start = i + 1
    items.append(s[start:])
    out = []
    for item in (t.strip() for t in items):
        if item:
            out += _plus_minus(item)
        if len(out) > MAX_ITEMS:
            return None
    return out


def _plus_minus(item: str) -> list[str]:
    """`a \\pm b` -> [a + b, a - b] (one top-level \\pm; b in parentheses when it is a sum)."""
    parts = _top_level_split(item, "\\pm")
    if len(parts) != 2:
        return [item]
    a, b = parts[0].strip(), parts[1].strip()
    if re.search(r"(?<!^)[+-]", b):
        b = f"({b})"
    return [f"{a}+{b}", f"{a}-{b}"] if a else [b, f"-{b}"]


def _top_level_split(s: str, sep: str) -> list[str]:
    """`s` split at each `sep` outside brackets (`sep` not followed by a letter)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i) and not s[i + len(sep) : i + len(sep) + 1].isalpha():
            parts.append(s[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    return parts + [s[start:]]


# --- rules 3-6: one value against another -----------------------------------------------------------
_CHOICE = re.compile(r"\(?([A-Z])\)?")
_WORDS = re.compile(r"[A-Za-z][A-Za-z' ]*[A-Za-z]")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")
_RELATIONS = re.compile(
    r"\\(?:to|gets|[lL]eftarrow|[rR]ightarrow|[lL]eftrightarrow|longrightarrow|implies|iff|mapsto|approx|sim|simeq"
    r"|cong|equiv|neq?|pmod|bmod|mod|mid|propto|leq?|geq?|lt|gt|leqslant|geqslant)(?![a-zA-Z])|[<>]"
)
_NUMERAL = re.compile(r"([0-9A-Z]+)_\{?(\d+)\}?")  # 1011_2: a numeral in a base
_GREEK = r"\\(?:alpha|beta|gamma|delta|theta|phi|lambda|mu|omega|rho|sigma|tau)"
_NAME = re.compile(
    rf"(?:[A-Za-z]|{_GREEK})(?:_\{{?\w+\}}?)?'*(?:\([^()=]*\))?|[A-Z]{{2,3}}|\\angle ?[A-Z]{{1,3}}|m\\angle ?[A-Z]{{1,3}}"
)


def _item_equal(p: str, g: str, timeout_s: float) -> bool:
    if _compact(p) == _compact(g):
        return True
    if "\\approx" in g:  # a gold `\approx 8.24` or `\frac23 \approx 0.67`: either side, approximated or not
        p = p.removeprefix("\\approx").strip()
        return any(_item_equal(p, side.strip(), timeout_s) for side in g.split("\\approx") if side.strip())
    numerals = [_NUMERAL.fullmatch(x) for x in (p, g)]
    if any(numerals):  # rule 3: 12_3 is five, not 12; digits and base must both agree
        return all(numerals) and len({(m.group(1).lstrip("0"), int(m.group(2))) for m in numerals}) == 1
    choice = _CHOICE.fullmatch(g)
    if choice:  # rule 6: a choice is one letter
        picked = _CHOICE.fullmatch(p)
        return bool(picked) and picked.group(1) == choice.group(1)
    if _WORDS.fullmatch(g):  # words compare as words, never as products of symbols
        return bool(_WORDS.fullmatch(p)) and " ".join(p.lower().split()) == " ".join(g.lower().split())
    if not {w.lower() for w in _WORD.findall(p)} <= {w.lower() for w in _WORD.findall(g)}:
        return False  # words the gold does not use (a hedge, a remark) are not part of a value
    if not set(_RELATIONS.findall(p)) <= set(_RELATIONS.findall(g)):
        return False  # x \approx 5, x \to 5, 5 \pmod 7: not the statement that the answer is 5
    g_sides, p_sides = _sides(g), _sides(p)
    if len(g_sides) > 2 or len(p_sides) > 4:
        return False
    g_name = g_sides[0] if len(g_sides) == 2 and _NAME.fullmatch(g_sides[0]) else None
    if len(g_sides) == 2 and g_name is None:  # rule 5c: an equation (a curve, a plane) against an equation
        return len(p_sides) == 2 and _symbolic(p, g, timeout_s)
    value = g_sides[-1]
    if len(p_sides) == 1:
        return _value_equal(p, value, timeout_s)
    if _NAME.fullmatch(p_sides[0]):  # rule 5a/5b: `x = ...` names what it gives
        if g_name is not None and _compact(p_sides[0]) != _compact(g_name):
            return False
        p_sides = p_sides[1:]
    elif g_name is not None:  # `2x + 0 = 10` against `x = 5`: equations, compared as equations
        return len(p_sides) == 2 and _symbolic(p, g, timeout_s)
    return all(_value_equal(side, value, timeout_s) for side in p_sides)  # rule 5b: a true chain only


def _sides(s: str) -> list[str]:
    """The sides of `a = b = c` (split at `=` outside brackets), stripped."""
    if "=" not in s:
        return [s]
    parts, depth, start = [], 0, 0
    for m in re.finditer(r"[()\[\]{}]|(?<![<>!=\\])=(?!=)", s):
        c = m.group()
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            parts.append(s[start : m.start()])
            start = m.end()
    return [t.strip() for t in parts + [s[start:]]]


def _value_equal(p: str, g: str, timeout_s: float) -> bool:
    """Rule 3 (exact numbers) then rule 7 (math-verify on exact spellings)."""
    p_num, g_num = exact_number(p), exact_number(g)
    if p_num is not None and g_num is not None:
        return p_num == g_num
    return _symbolic(p, g, timeout_s)


def _symbolic(p: str, g: str, timeout_s: float) -> bool:
    if max(len(p), len(g)) > MAX_SYMBOLIC_CHARS:
        return False
    p, g = _exact_decimals(p), _exact_decimals(g)
    return p is not None and g is not None and SYMBOLIC.equal(g, p, timeout_s)


_DECIMAL = re.compile(r"(?<![\d.])(\d*)\.(\d+)(?![\d.])")


def _exact_decimals(s: str) -> str | None:
    """Every decimal written as the fraction it spells (0.333333 -> 333333/1000000), so that sympy
    never rounds; None if a decimal has more than 50 digits after the point."""
    if any(len(m.group(2)) > 50 for m in _DECIMAL.finditer(s)):
        return None
    return _DECIMAL.sub(lambda m: f"{{\\frac{{{m.group(1) or 0}{m.group(2)}}}{{1{'0' * len(m.group(2))}}}}}", s)


_MIXED = re.compile(r"(-?)(\d{1,9}) ?\\frac\{(\d{1,9})\}\{(\d{1,9})\}")
_FRACTION = re.compile(r"(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}")
_POWER = re.compile(r"(-?)(\d{1,6})\^\{?(\d{1,5})\}?")
_MAX_POWER_BITS = 10_000  # 2^{10} is 1,024; 10^{10^{10}} is not written out


def exact_number(s: str) -> Fraction | None:
    """The exact value of a number written as an integer, decimal, fraction, mixed number (`2\\frac12`
    = 5/2) or integer power (`2^{10}`, up to 10,000 bits), else None; never raises."""
    if len(s) > MAX_NUMBER_CHARS:
        return None
    s = s.replace(" ", "")  # items: juxtaposed numbers were split apart already
    try:
        if m := _MIXED.fullmatch(s):
            sign, whole, num, den = m.groups()
            value = int(whole) + Fraction(int(num), int(den))
            return -value if sign else value
        if m := _FRACTION.fullmatch(s):
            sign, num, den = m.groups()
            value = Fraction(num) / Fraction(den)
            return -value if sign else value
        if m := _POWER.fullmatch(s):
            sign, base, exponent = m.group(1), int(m.group(2)), int(m.group(3))
            if exponent * max(base.bit_length(), 1) > _MAX_POWER_BITS:
                return None
            return Fraction(-(base**exponent) if sign else base**exponent)
    except (ValueError, ZeroDivisionError, OverflowError, MemoryError):
        return None
    return parse_number(s)


def _compact(s: str) -> str:
    """`s` without spaces, except between two letters or digits (`5 6` stays two numbers)."""
    return re.sub(r"(?<![\dA-Za-z]) +| +(?![\dA-Za-z])", "", s)


_UNITS = (
    r"(?:units?|sq(?:uare)?|cubic|cm|centimeters?|mm|km|m|meters?|kilometers?|in|inch(?:es)?|ft|feet|foot|"
    r"yards?|miles?|mph|degrees?|dollars?|cents?|seconds?|minutes?|hours?|days?|weeks?|months?|years?|"
    r"pounds?|ounces?|grams?|kg|g|liters?|gallons?|people|students|ways)"
)
_UNIT_TEXT = re.compile(  # \text{ square feet} at the end: words only, no time of day, nothing like \text{ or 6}
    r"\\(?:text|mbox|mathrm)\{\s?(?![^{}]*\b(?:[ap]\.m\.|or|and|maybe|perhaps|possibly|probably|if|else)(?![a-z]))"
    r"[A-Za-z. ]*\}\s*(?:\^\s*\{?[23]\}?)?\s*\Z"
)
_UNIT_WORDS = re.compile(rf"(?<=[\d}}])\s*(?:{_UNITS}\b\s*){{1,3}}(\^\s*\{{?[23]\}}?)?\.?\Z")


def normalize(answer: str) -> str:
    """A canonical spelling of a LaTeX answer (spaces kept single), in time linear in its length."""
    s = re.sub(r"\s+", " ", answer.replace("\u2212", "-").replace("~", " ")).strip()  # short \s* runs below
    s = re.sub(r"(?<=\d)(?:\{,\}|,\s*\\!\s*|\\,)(?=\d{3}(?!\d))", "", s)  # 1{,}000, 10,\!080, 10\,000
    s = s.replace("\\!", "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\(left|right)(?![a-zA-Z])", "", s).replace("\\displaystyle", "")
    s = re.sub(r"\\hspace\*?\{[^{}]*\}", " ", s)
    s = re.sub(r"(?<!\\)\\(,|;|:| |quad|qquad|[a-z]*space|hfill)(?![a-zA-Z])", " ", s)  # spacing commands
    s = re.sub(r"\^(?:\s*\{)?\s*\\circ\s*\}?", "", s).replace("\\circ", "")  # degrees (linear: one \s* run)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    end = len(s)
    for _ in range(3):  # units: \text{ cm} after a number (words only: not \text{ or 6}, not (A) \text{ B})
        unit = _UNIT_TEXT.search(s, 0, end)
        if unit is None:
            break
        end = len(s[: unit.start()].rstrip())
        if re.search(r"\d[^A-Za-z]*\Z", s[:end]):
            s = s[:end]
            break
    s = re.sub(  # other \text{...} and font wrappers
        r"\\(?:text|textbf|textrm|textit|textnormal|mbox|mathrm|mathbf|mathit|mathsf|boldsymbol|bm)\{([^{}]*)\}",
        r"\1",
        s,
    )
    s = re.sub(r"\\(?:bf|rm|it)(?![a-zA-Z]) ?", "", s)
    s = _UNIT_WORDS.sub("", s)  # 5 cm, 3 square feet
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    s = re.sub(r"\\frac ?(\d) ?(\d)", r"\\frac{\1}{\2}", s)  # \frac12, \frac 3 8
    s = re.sub(r"\\frac ?(\d) ?\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\} ?(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt ?(\d|[a-zA-Z](?![a-zA-Z]))", r"\\sqrt{\1}", s)  # \sqrt2
    s = re.sub(r"\\log_ ?(\d+) ?", r"\\log_{\1}", s)  # \log_2 8: one value, not 2 and 8
    s = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", s)  # .5
    return s


def reference(record: dict) -> tuple[str, str]:
    """(the reference solution, which must score 1; the same ending in a box no answer equals, which must score 0)."""
    return record.get("solution") or f"\\boxed{{{record['answer']}}}", "The answer is \\boxed{\\text{none of these}}."
