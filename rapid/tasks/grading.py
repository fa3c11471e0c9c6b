"""Answer extraction and comparison shared by the tasks graded on a final \\boxed{} answer."""
from __future__ import annotations

import re
from fractions import Fraction


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) in `text`, braces balanced; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


_STRIP = [r"\\text\{([^{}]*)\}", r"\\mathrm\{([^{}]*)\}"]


def parse_number(answer: str) -> Fraction | None:
    """A number written as an integer, decimal or simple fraction (\\frac{a}{b}, a/b), else None.
    Spaces, `$`, thousands separators (`1,000`, `1{,}000`, `1,\\!000`) and a trailing `.` are ignored."""
    s = answer.strip()
    for pattern in _STRIP:
        s = re.sub(pattern, r"\1", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\!", "").replace("{,}", ",").replace(" ", "").rstrip(".")
    s = re.sub(r"(?<=\d),(?=\d{3}(\D|$))", "", s)
    frac = re.fullmatch(r"(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if frac:
        sign, num, den = frac.groups()
        return None if int(den) == 0 else Fraction(int(num), int(den)) * (-1 if sign else 1)
    try:
        return Fraction(s) if re.fullmatch(r"-?\d+(\.\d+)?(/-?\d+)?", s) else None
    except (ValueError, ZeroDivisionError):
        return None


def boxed_number_reward(completion: str, answer: str) -> float:
    """1.0 if the last \\boxed{} of `completion` holds a number equal to `answer`, else 0.0."""
    boxed = last_boxed(completion)
    if boxed is None:
        return 0.0
    got, want = parse_number(boxed), parse_number(answer)
    return float(got is not None and want is not None and got == want)
