"""MATH grading by the strict grammar (rapid/tasks/math_answer.py), class by class: each wrong answer
scores 0 and each correct form scores 1, through the full reward path (the completion's last box against
a record). Every case was written for this file; the expected verdicts are a careful grader's."""

import json
import random
import time
from pathlib import Path

import pytest

from rapid.tasks import math as task
from rapid.tasks.grading import SYMBOLIC

ONE = "What is the value of $x$?"


def score(pred: str, gold: str, problem: str = ONE) -> float:
    record = {"problem": problem, "answer": gold, "grading": {"timeout_s": 60.0}}
    return task.reward(f"So the answer is $\\boxed{{{pred}}}$.", record)


def disagreements(cases) -> list[tuple]:
    """The cases whose score differs from the expected one (empty when all agree)."""
    return [case for case in cases if score(*case[:-1]) != case[-1]]


# hedges: inside brackets and parentheses, with words no splitter knows, as operators
HEDGES = [
    ("(3 \\text{ or } 4)", "4", 0.0),
    ("[3 \\text{ or } 4]", "4", 0.0),
    ("\\{3 \\text{ or } 4\\}", "4", 0.0),
    ("\\left(3 \\text{ oder } 4\\right)", "4", 0.0),
    ("3 \\text{ oder } 4", "4", 0.0),
    ("3 \\text{ vel } 4", "4", 0.0),
    ("3 \\text{ alternatively } 4", "4", 0.0),
    ("3 \\text{ otherwise } 4", "4", 0.0),
    ("3/4 \\text{ (or } 4)", "4", 0.0),
    ("\\text{either } 3 \\text{ or } 4", "4", 0.0),
    ("3 \\lor 4", "4", 0.0),
    ("3 \\vee 4", "4", 0.0),
    ("3 | 4", "4", 0.0),
    ("3 / 4", "4", 0.0),
    ("3 \\text{ xor } 4", "4", 0.0),
    ("\\{3, 4\\}", "4", 0.0),
    ("(3, 4)", "4", 0.0),
    ("\\text{3 or 4}", "4", 0.0),
    ("3\\;\\text{or}\\;4", "4", 0.0),
    ("3 \\mathrm{or} 4", "4", 0.0),
    ("3 \\operatorname{or} 4", "4", 0.0),
    ("3 \\textsf{ or } 4", "4", 0.0),
    ("3 \\quad\\text{(or 4)}", "4", 0.0),
    ("\\frac{3 \\text{ or } 4}{1}", "4", 0.0),
    ("\\sqrt{9 \\text{ or } 16}", "4", 0.0),
    ("4 \\text{ (maybe 3)}", "4", 0.0),
    ("4 \\ \\text{if} \\ x>0", "4", 0.0),
    ("4 \\text{ unless } x = 0", "4", 0.0),
    ("4 \\pmod{5}", "4", 0.0),
    ("4 + 0 \\cdot \\text{anything}", "4", 0.0),
    ("4 + 0\\cdot 3", "4", 1.0),
]

# words after a number that change its meaning: magnitudes, another unit, "etc."; units the gold or
# the question has; scientific notation written as a product, not as 5e6
UNITS = [
    ("5 \\text{ million}", "5", 0.0),
    ("5 \\text{ thousand}", "5", 0.0),
    ("5\\text{ million}", "5", "How many people, in millions, live there?", 0.0),
    ("5 million", "5", 0.0),
    ("5 \\text{ dozen}", "5", 0.0),
    ("5 \\text{ dozen}", "5", "How many dozen eggs did she buy?", 0.0),
    ("5 \\text{ hundred}", "5", 0.0),
    ("5 \\text{ feet}", "5", "How many inches long is the board?", 0.0),
    ("5 \\text{ feet}", "5\\text{ inches}", 0.0),
    ("5 \\text{ ft}", "5 \\text{ feet}", 1.0),
    ("5 \\text{ etc.}", "5", 0.0),
    ("5, \\text{etc.}", "5", 0.0),
    ("5 \\text{ etc}", "5", 0.0),
    ("5 \\ldots", "5", 0.0),
    ("5 \\text{ or so}", "5", 0.0),
    ("5 \\text{ at least}", "5", 0.0),
    ("\\text{at least } 5", "5", 0.0),
    ("\\text{about } 5", "5", 0.0),
    ("5 \\text{ approximately}", "5", 0.0),
    ("5 \\text{ cm}^2", "5", "What is the length, in cm, of the side?", 0.0),
    ("5 \\text{ cm}", "5", "What is the length, in cm, of the side?", 1.0),
    ("5 \\text{ cm}", "5", "What is the length, in centimeters, of the side?", 1.0),
    ("5 \\text{ mm}", "5", "What is the length, in centimeters, of the side?", 0.0),
    ("5\\%", "5", "What is the value of $x$?", 0.0),
    ("5\\%", "5", "What percent of the class passed?", 1.0),
    ("0.05", "5\\%", 0.0),
    ("5 \\text{ percent}", "5\\%", 1.0),
    ("5", "5\\%", 1.0),
    ("5 \\text{ times}", "5", 0.0),
    ("5 \\text{ half}", "5", 0.0),
    ("5 \\text{ thousands}", "5", "How many thousands of dollars did he earn?", 0.0),
    ("5 \\text{ billion}", "5", 0.0),
    ("5 \\times 10^{6}", "5", 0.0),
    ("5 \\times 10^{6}", "5000000", 1.0),
    ("5\\cdot 10^6", "5{,}000{,}000", 1.0),
    ("5e6", "5000000", 0.0),
    ("5E6", "5000000", 0.0),
    ("5 \\text{e} 6", "5000000", 0.0),
    ("1.5 \\times 10^{-3}", "0.0015", 1.0),
    ("1.5 \\times 10^{-3}", "0.015", 0.0),
    ("10^{-3}", "0", 0.0),
    ("\\$5", "5", "How much money, in dollars, did he spend?", 1.0),
    ("\\$5", "5", "How many apples did he buy?", 0.0),
    ("5 \\text{ apples}", "5", "How many apples did he buy?", 1.0),
    ("5 \\text{ pears}", "5", "How many apples did he buy?", 0.0),
    ("5 \\text{ cents}", "5", "How much did he pay, in dollars?", 0.0),
    ("5 \\text{ dollars}", "\\$5", 1.0),
    ("5", "5\\text{ million}", 0.0),  # a unit may be left out, a magnitude may not
    ("5 \\text{ millions}", "5\\text{ million}", 1.0),
    ("5 \\text{ thousand}", "5\\text{ million}", 0.0),
    ("5\\text{, 6}", "5", 0.0),  # text with no word in it is no unit
    ("5 \\text{ (6)}", "5", 0.0),
    ("5 \\text{ ?}", "5", 0.0),
    ("5 \\text{...}", "5", 0.0),
    ("5\\text{ cm}\\text{, 6}", "5", "What is the length, in cm?", 0.0),
]

# objects of one kind: math-verify equates {4} and [4, 4] with 4; equations that are identities;
# intervals, sets and matrices compared element by element, each element exactly
KINDS = [
    ("\\{4\\}", "4", 0.0),
    ("[4, 4]", "4", 0.0),
    ("(4, 4)", "4", 0.0),
    ("\\begin{pmatrix} 4 \\end{pmatrix}", "4", 0.0),
    ("\\emptyset", "0", 0.0),
    ("(1, 2)", "\\{1, 2\\}", 0.0),
    ("\\{1, 2\\}", "(1, 2)", 0.0),
    ("(1, \\{2\\})", "(1, 2)", 0.0),
    ("2 \\cdot \\{4\\}", "8", 0.0),
    ("[1, 2] \\cup [2, 3]", "[1, 3]", 1.0),
    ("\\{2, 1\\}", "\\{1, 2\\}", 1.0),
    ("0 = 0", "x^2 + y^2 = 13", 0.0),
    ("x^2 + y^2 = x^2 + y^2", "x^2 + y^2 = 13", 0.0),
    ("0 = 0", "y = 2x + 3", 0.0),
    ("y = y", "y = 2x + 3", 0.0),
    ("13 = x^2 + y^2", "x^2 + y^2 = 13", 1.0),
    ("2x^2 + 2y^2 = 26", "x^2 + y^2 = 13", 1.0),
    ("2x + 3 = y", "y = 2x + 3", 1.0),
    ("0.5x", "\\frac{x}{2}", 1.0),
    ("0.5x", "\\frac{x}{3}", 0.0),
    ("-\\infty", "\\infty", 0.0),
    ("\\frac{1}{0}", "\\infty", 0.0),
    ("\\frac{0}{0}", "0", 0.0),
    ("\\infty - \\infty", "0", 0.0),
    ("\\sqrt{x^2}", "x", 0.0),
    ("|x|", "\\sqrt{x^2}", 1.0),
    ("x - x", "0", 1.0),
    # containers element by element: math-verify confirms no endpoint or element exactly
    ("[\\sqrt{2} + 10^{-100}, 3]", "[\\sqrt{2}, 3]", 0.0),
    ("[\\sqrt{2}, 3]", "[\\sqrt{2}, 3]", 1.0),
    ("[2^{1/2}, 3]", "[\\sqrt{2}, 3]", 1.0),
    ("\\{\\sqrt{2} + 10^{-100}, 3\\}", "\\{\\sqrt{2}, 3\\}", 0.0),
    ("\\{3, \\sqrt{2}\\}", "\\{\\sqrt{2}, 3\\}", 1.0),
    ("(-\\infty, \\sqrt{2} + 10^{-100}) \\cup (3, \\infty)", "(-\\infty, \\sqrt{2}) \\cup (3, \\infty)", 0.0),
    ("(3, \\infty) \\cup (-\\infty, \\sqrt{2})", "(-\\infty, \\sqrt{2}) \\cup (3, \\infty)", 1.0),
    (
        "\\begin{pmatrix} \\sqrt{2} + 10^{-100} \\\\ 1 \\end{pmatrix}",
        "\\begin{pmatrix} \\sqrt{2} \\\\ 1 \\end{pmatrix}",
        0.0,
    ),
    (
        "\\begin{pmatrix} \\frac{2}{\\sqrt{2}} \\\\ 1 \\end{pmatrix}",
        "\\begin{pmatrix} \\sqrt{2} \\\\ 1 \\end{pmatrix}",
        1.0,
    ),
    ("(\\frac{\\sqrt{3}}{3}, 1)", "(\\frac{1}{\\sqrt{3}}, 1)", 1.0),
    ("(\\pi + 10^{-80}, 1)", "(\\pi, 1)", 0.0),
    ("[1, 2] \\cup [2, 3]", "[1, 3]", 1.0),
]

# equations: inside brackets, with ==, false, or about another variable than the gold's
EQUATIONS = [
    ("(x = 4)", "4", 0.0),
    ("\\{x = 4\\}", "4", 0.0),
    ("[y = 4]", "x = 4", 0.0),
    ("(2 + 2 = 5)", "5", 0.0),
    ("x == 4", "4", 0.0),
    ("x == 4", "x = 4", 0.0),
    ("y == 4", "x = 4", 0.0),
    ("2+2==5", "5", 0.0),
    ("y = 4", "x = 4", 0.0),
    ("x_1 = 4", "x = 4", 0.0),
    ("X = 4", "x = 4", 0.0),
    ("x = 4", "x = 4", 1.0),
    ("4 = x", "x = 4", 1.0),
    ("y = 4", "4", 0.0),
    ("x = 4", "4", 1.0),
    ("x = 3 + 1 = 5", "5", 0.0),
    ("x = 5 = 3 + 2", "5", 1.0),
    ("x := 5", "5", 0.0),
    ("x \\coloneqq 5", "5", 0.0),
    ("x \\equiv 5", "5", 0.0),
    ("x \\Rightarrow 5", "5", 0.0),
    ("x \\leq 5", "5", 0.0),
    ("x = 5, y = 6", "5", 0.0),
    ("f(x) = 5", "5", "What is $f(2)$?", 0.0),
    ("f(2) = 5", "5", "What is $f(2)$?", 1.0),
    ("x^2 = 25", "5", 0.0),
    ("x = \\pm 5", "5", 0.0),
    ("\\pm 5", "5, -5", "Find all solutions.", 1.0),
    ("y = 2x + 3", "y=2x+3", 1.0),
    ("2x + 3 = y", "y=2x+3", 1.0),
    ("y = 2x+4", "y=2x+3", 0.0),
    ("z = 2x + 3", "y=2x+3", 0.0),
    ("y - 2x = 3", "y=2x+3", 1.0),
    ("x + y = 0", "x + y + z = 0", 0.0),
]

# the real odd root of a negative number (sympy's principal root is complex)
ODD_ROOTS = [
    ("\\sqrt[3]{-8}", "-2", 1.0),
    ("-2", "\\sqrt[3]{-8}", 1.0),
    ("\\sqrt[3]{-27}", "-3", 1.0),
    ("\\sqrt[3]{-8}", "2", 0.0),
    ("\\sqrt[5]{-32}", "-2", 1.0),
    ("(-8)^{1/3}", "-2", 1.0),
    ("(-8)^{\\frac{1}{3}}", "-2", 1.0),
    ("(-8)^{2/3}", "4", 1.0),
    ("\\sqrt[3]{-16}", "-2\\sqrt[3]{2}", 1.0),
    ("\\sqrt[3]{-2}", "-\\sqrt[3]{2}", 1.0),
    ("\\sqrt[3]{-x}", "-\\sqrt[3]{x}", 1.0),
    ("\\sqrt[3]{-\\frac{1}{8}}", "-\\frac12", 1.0),
    ("\\sqrt{-4}", "2", 0.0),
    ("\\sqrt{-4}", "-2", 0.0),
    ("\\sqrt[3]{1-9}", "-2", 1.0),
    ("\\sqrt[4]{16}", "2", 1.0),
    ("\\sqrt[4]{16}", "-2", 0.0),
]

# degrees: a unit after an angle, an angle (times pi/180) inside a function or a tuple
ANGLES = [
    ("\\frac{\\sqrt{3}}{2}", "\\sin 60^\\circ", 1.0),
    ("\\sin 60^\\circ", "\\frac{\\sqrt{3}}{2}", 1.0),
    ("\\sin 30^\\circ", "\\frac{\\sqrt{3}}{2}", 0.0),
    ("(6, \\frac{47\\pi}{36})", "(6,235^\\circ)", 1.0),
    ("(6, 235^\\circ)", "(6,235^\\circ)", 1.0),
    ("(6, 235)", "(6,235^\\circ)", 0.0),
    ("90^\\circ", "90", "What is the angle, in degrees?", 1.0),
    ("\\frac{\\pi}{2}", "90", "What is the angle, in degrees?", 0.0),
    ("\\cos 6^\\circ \\sin 12^\\circ \\csc 18^\\circ", "\\cos(6^\\circ)\\sin(12^\\circ)\\csc(18^\\circ)", 1.0),
]

# answers in words, choices, and characters outside the grammar
WORDS = [
    ("\\text{five}", "5", 0.0),
    ("five", "5", 0.0),
    ("\\text{five}", "\\mbox{four}", 0.0),
    ("\\text{four}", "\\mbox{four}", 1.0),
    ("\\text{Four}", "\\mbox{four}", 1.0),
    ("\\text{four or five}", "\\mbox{four}", 0.0),
    ("\\text{four (or five)}", "\\mbox{four}", 0.0),
    ("\\text{Evelyn and Navin}", "\\text{Evelyn}", 0.0),
    ("\\text{(C) or (D)}", "\\text{(C)}", 0.0),
    ("(C)(D)", "\\text{(C)}", 0.0),
    ("\\text{C, D}", "\\text{(C)}", 0.0),
    ("C", "\\text{(C)}", 1.0),
    ("\\text{(c)}", "\\text{(C)}", 0.0),
    ("\\text{not } C", "\\text{(C)}", 0.0),
    ("\\text{C.}", "\\text{(C)}", 1.0),
    ("\\text{A, C}", "\\text{C,A}", "Enter the letters, separated by commas.", 1.0),
    ("\\text{A, C, C}", "\\text{C,A}", "Enter the letters, separated by commas.", 0.0),
    ("\\text{A, B}", "\\text{C,A}", "Enter the letters, separated by commas.", 0.0),
    ("\\text{Sunday}", "\\text{Sunday}", 1.0),
    ("\\text{sunday}", "\\text{Sunday}", 1.0),
    ("\\text{Sunday, probably}", "\\text{Sunday}", 0.0),
    ("\\text{DCBA}", "\\text{CBAD}", 0.0),
    ("DCBA", "CBAD", 0.0),
    ("５", "5", 0.0),
    ("−5", "-5", 1.0),
    ("5 × 2", "10", 0.0),
    ("√2", "\\sqrt{2}", 0.0),
    ("π", "\\pi", 0.0),
    ("½", "\\frac12", 0.0),
    ("5\u200b", "5", 0.0),
    ("5\\text{ or\u200b }6", "5", 0.0),
]

# numbers too large to write out score 0 in the parent, without sympy; tiny differences are not 0
LARGE = [
    ("10^{10^{10}}", "5", 0.0),
    ("9^{9^{9^{9}}}", "1", 0.0),
    ("(10^{10})!", "5", 0.0),
    ("100000!", "5", 0.0),
    ("2^{2^{2^{2^{2}}}}", "5", 0.0),
    ("2^{2^{2^{2}}}", "65536", 1.0),
    ("x^{10^{10}}", "x", 0.0),
    ("\\sqrt[10^{10}]{2}", "1", 0.0),
    ("10^{-10^{10}}", "0", 0.0),
    ("0.1^{99999}", "0", 0.0),
    ("\\frac{1}{10^{9999}}", "0", 0.0),
    ("1.0000000000000000000000000000001", "1", 0.0),
    ("\\sqrt{2} + 10^{-30}", "\\sqrt{2}", 0.0),
    ("\\pi - 3.14159265358979", "0", 0.0),
    ("2^{100}", "1267650600228229401496703205376", 1.0),
    ("2^{100}", "1267650600228229401496703205377", 0.0),
]

# equivalences the grader accepted before the grammar, and must still accept (and their near misses)
CONTROLS = [
    ("\\frac{2}{4}", "\\frac12", 1.0),
    ("2/4", "\\frac12", 1.0),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt2}{2}", 1.0),
    ("2\\sqrt{3}", "\\sqrt{12}", 1.0),
    ("\\sqrt{12}", "2\\sqrt3", 1.0),
    ("3\\sqrt{2}/2", "\\frac{3\\sqrt{2}}{2}", 1.0),
    ("\\frac{3}{2}\\sqrt{2}", "\\frac{3\\sqrt{2}}{2}", 1.0),
    ("(-\\infty, 3]", "(-\\infty,3]", 1.0),
    ("(-\\infty, 3) \\cup (4, \\infty)", "(-\\infty,3)\\cup(4,\\infty)", 1.0),
    ("(4, \\infty) \\cup (-\\infty, 3)", "(-\\infty,3)\\cup(4,\\infty)", 1.0),
    ("(-\\infty, 3]", "(-\\infty,3)", 0.0),
    ("[2, 5)", "[2,5)", 1.0),
    ("1 + \\sqrt{19}, 1 - \\sqrt{19}", "1 \\pm \\sqrt{19}", "Find all solutions.", 1.0),
    ("1 \\pm \\sqrt{19}", "1 + \\sqrt{19}, 1 - \\sqrt{19}", "Find all solutions.", 1.0),
    ("\\{1\\pm\\sqrt{5},-2\\}", "\\{1\\pm\\sqrt{5},-2\\}", 1.0),
    ("\\{-2, 1 + \\sqrt{5}, 1 - \\sqrt{5}\\}", "\\{1\\pm\\sqrt{5},-2\\}", 1.0),
    ("\\{-2, 1 + \\sqrt{5}\\}", "\\{1\\pm\\sqrt{5},-2\\}", 0.0),
    ("\\{2 \\pm 1\\}", "\\{1, 3\\}", 1.0),
    ("3 \\pm 2\\sqrt{2}", "3 + 2\\sqrt2, 3 - 2\\sqrt 2", "Find all roots.", 1.0),
    ("25\\%", "25\\%", 1.0),
    ("25", "25\\%", 1.0),
    ("25 \\text{ percent}", "25\\%", 1.0),
    ("0.25", "25\\%", 0.0),
    ("2\\frac{1}{2}", "\\frac52", 1.0),
    ("2 \\frac{1}{2}", "2.5", 1.0),
    ("1,000", "1000", 1.0),
    ("1{,}000", "1000", 1.0),
    ("1000", "1,\\!000", 1.0),
    ("(1, 2)", "(1,2)", 1.0),
    ("(2, 1)", "(1,2)", 0.0),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", 1.0),
    ("\\begin{pmatrix} 2/4 \\\\ 0.5 \\end{pmatrix}", "\\begin{pmatrix} 1/2 \\\\ 1/2 \\end{pmatrix}", 1.0),
    ("\\begin{bmatrix} 1 & 0 \\\\ 0 & 1 \\end{bmatrix}", "\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", 1.0),
    ("\\begin{pmatrix} 1 & 0 \\\\ 0 & 2 \\end{pmatrix}", "\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", 0.0),
    ("x^2 + 2x + 1", "(x+1)^2", 1.0),
    ("(x+1)(x+2)", "x^2+3x+2", 1.0),
    ("2x(x+1)", "2x^2 + 2x", 1.0),
    ("1 + i", "i + 1", 1.0),
    ("3 - 2i", "3-2i", 1.0),
    ("\\frac{1}{2} + \\frac{1}{2}i", "\\frac{1+i}{2}", 1.0),
    ("\\pi", "\\pi", 1.0),
    ("2\\pi", "2 \\pi", 1.0),
    ("\\frac{\\pi}{2}", "\\frac12\\pi", 1.0),
    ("\\frac{\\pi}{2}", "90", 0.0),
    ("\\cos\\frac{\\pi}{3}", "\\frac12", 1.0),
    ("\\sin^2 x + \\cos^2 x", "1", 1.0),
    ("\\log_2 8", "3", 1.0),
    ("\\ln e^2", "2", 1.0),
    ("5!", "120", 1.0),
    ("\\binom{5}{2}", "10", 1.0),
    ("|-3|", "3", 1.0),
    ("\\lfloor 2.5 \\rfloor", "2", 1.0),
    ("\\{1, 2, 3\\}", "\\{3, 2, 1\\}", 1.0),
    ("\\{1, 2\\}", "\\{1, 2, 3\\}", 0.0),
    ("\\emptyset", "\\emptyset", 1.0),
    ("x \\in [-2, 7]", "x \\in [-2,7]", 1.0),
    ("[-2, 7]", "x \\in [-2,7]", 1.0),
    ("y = \\frac12 x + 2", "y = \\frac{1}{2} x + 2", 1.0),
    ("y = 0.5x + 2", "y = \\frac{1}{2} x + 2", 1.0),
    ("k = \\frac{-33}{2}", "k = \\frac{-33}{2}", 1.0),
    ("-16.5", "k = \\frac{-33}{2}", 1.0),
    ("\\frac{x^2}{16} - \\frac{y^2}{9} = 1", "\\frac{x^2}{16} - \\frac{y^2}{9} = 1", 1.0),
    ("9x^2 - 16y^2 = 144", "\\frac{x^2}{16} - \\frac{y^2}{9} = 1", 1.0),
    ("2x + z - 5 = 0", "2x + z - 5 = 0", 1.0),
    ("4x + 2z - 10 = 0", "2x + z - 5 = 0", 1.0),
    ("AB = 9", "AB=9", 1.0),
    ("9", "AB=9", 1.0),
    ("CD = 9", "AB=9", 0.0),
    ("3R^2", "3R^2", 1.0),
    ("3r^2", "3R^2", 0.0),
    ("\\frac{1}{2004!}", "\\frac{1}{2004!}", 1.0),
    ("\\$ 5", "\\$5", 1.0),
    ("-\\$0.50", "-\\$0.50", 1.0),
    ("-0.5", "-\\$0.50", 1.0),
    ("10 \\text{ inches}", "10\\text{ inches}", 1.0),
    ("10 \\text{ in}", "10\\text{ inches}", 1.0),
    ("10", "10\\text{ inches}", 1.0),
    ("45 \\text{ units}^2", "45 \\text{ units}^2", 1.0),
    ("45 \\text{ square units}", "45 \\text{ units}^2", 1.0),
    ("45", "45 \\text{ units}^2", 1.0),
    ("8.24", "\\approx 8.24 \\text{ mph}", 1.0),
    ("8.24 \\text{ mph}", "\\approx 8.24 \\text{ mph}", 1.0),
    ("\\frac{2}{3}", "\\$\\dfrac23 \\approx \\$0.67", 1.0),
    ("0.67", "\\$\\dfrac23 \\approx \\$0.67", 1.0),
    ("1011_2", "1011_2", 1.0),
    ("1011_{2}", "1011_2", 1.0),
    ("\\text{A5}_{11}", "\\text{A5}_{11}", 1.0),
    ("152A_{11}", "152A_{11}", 1.0),
    ("1:2", "1:2", 1.0),
    ("1 : 2", "1:2", 1.0),
    ("\\text{4:30 p.m.}", "\\text{4:30 p.m.}", 1.0),
    ("-80\\leq g(x)\\leq 82", "-80\\leq g(x)\\leq 82", 1.0),
    ("-80 \\le g(x) \\le 82", "-80\\leq g(x)\\leq 82", 1.0),
    ("6, 8, 10", "6, 8\\text{, and }10", "Enter the side lengths separated by commas.", 1.0),
    ("10, 8, 6", "6, 8\\text{, and }10", "Enter the side lengths separated by commas.", 1.0),
    ("2 \\text{ and } 3", "2, 3", "Find all solutions.", 1.0),
    ("x = 2 \\text{ or } x = 3", "2, 3", "Find all solutions of $x^2-5x+6=0$.", 1.0),
    ("0.5", "\\frac{1}{2}", 1.0),
    (".5", "\\frac{1}{2}", 1.0),
    ("\\frac{5}{10}", "0.5", 1.0),
    ("1.50", "\\frac32", 1.0),
    ("3.0", "3", 1.0),
    ("\\dfrac{3}{4}", "\\tfrac34", 1.0),
    ("\\frac34", "0.75", 1.0),
    ("-\\frac{1}{2}", "\\frac{-1}{2}", 1.0),
    ("\\frac{-1}{2}", "-0.5", 1.0),
    ("2^{-1}", "\\frac12", 1.0),
    ("\\sqrt{\\frac{1}{4}}", "\\frac12", 1.0),
    ("\\sqrt[3]{27}", "3", 1.0),
    ("27^{1/3}", "3", 1.0),
    ("\\frac{\\sqrt{6}+\\sqrt{2}}{4}", "\\cos \\frac{\\pi}{12}", 1.0),
    ("\\frac{11}{15}\\text{ days}", "\\frac{11}{15}\\text{ days}", 1.0),
    ("\\frac{11}{15}", "\\frac{11}{15}\\text{ days}", 1.0),
    ("12\\sqrt{13}", "12\\sqrt{13}\\text{ feet}", 1.0),
    ("164\\pi", "164 \\pi \\mbox{ square feet}", 1.0),
    ("\\text{Evelyn}", "\\text{Evelyn}", 1.0),
    ("Evelyn", "\\text{Evelyn}", 1.0),
    ("\\textbf{(C)}", "\\text{(C)}", 1.0),
    ("\\text{(C)}", "C", 1.0),
    ("\\text{B, C}", "B, C", 1.0),
    ("\\mathbf{2340}", "2340", 1.0),
    ("\\overline{CD}", "\\overline{CD}", 1.0),
    ("\\frac{1}{7}\\triangle ABC", "\\frac{1}{7}\\triangle ABC", 1.0),
    ("2^{n-1}", "2^{n - 1}", 1.0),
    ("\\frac{2^n}{2}", "2^{n - 1}", 1.0),
    ("x_1 + x_2", "x_2 + x_1", 1.0),
    ("\\alpha + \\beta", "\\beta + \\alpha", 1.0),
    ("\\cos^2\\alpha", "\\cos^2\\alpha", 1.0),
    ("1 - \\sin^2\\alpha", "\\cos^2\\alpha", 1.0),
    ("\\tan \\theta = 2\\theta", "\\tan \\theta = 2\\theta", 1.0),
]

CLASSES = {"hedges": HEDGES, "units": UNITS, "equations": EQUATIONS, "odd roots": ODD_ROOTS, "words": WORDS}
CLASSES |= {"kinds": KINDS, "angles": ANGLES}
CLASSES |= {"large": LARGE, "controls": CONTROLS}


@pytest.fixture(scope="module", autouse=True)
def warm_checker():
    SYMBOLIC.equal("1", "1", 120.0)  # start the checker now: its start-up is not grading time


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_case_of_the_class_gets_its_verdict(name):
    assert disagreements(CLASSES[name]) == []


def test_both_directions_are_tested_in_every_class():
    for name, cases in CLASSES.items():
        verdicts = [case[-1] for case in cases]
        assert verdicts.count(0.0) >= 1 and verdicts.count(1.0) >= 1 or name == "large", name


def test_a_box_inside_the_last_box_or_around_it_scores_zero():
    record = {"problem": ONE, "answer": "5"}
    for completion in (
        "\\boxed{4 \\text{ or } \\boxed{5}}",  # the last box sits in another box
        "\\boxed{\\boxed{5}}",
        "\\fbox{4, \\boxed{5}}",
        "\\boxed{4 \\fbox{5}}",
        "\\boxed{\\boxed{4} 5}",  # a box inside the last box
    ):
        assert task.reward(completion, record) == 0.0, completion
    assert task.reward("first \\boxed{4}, then \\boxed{5}.", record) == 1.0  # the last box counts
    assert task.reward("\\boxed{\\frac{10}{2}} and $\\{x\\}$", record) == 1.0  # braces after it


def test_large_numbers_are_refused_without_sympy():
    for pred, gold, _ in LARGE:
        start = time.perf_counter()
        score(pred, gold)
        assert time.perf_counter() - start < 2.0, pred  # no case waits for sympy's time limit


def test_an_odd_root_of_a_negative_number_is_rational_in_the_parent():
    assert task.exact_number("\\sqrt[3]{-8}") == -2 and task.exact_number("(-8)^{2/3}") == 4
    assert task.exact_number("\\sqrt[5]{-\\frac{1}{32}}") == task.exact_number("-0.5")
    assert task.exact_number("\\sqrt{-4}") is None and task.exact_number("\\sqrt[3]{2}") is None


# --- generated attacks on every single-value MATH-500 answer ---------------------------------------
DATA = Path(__file__).parents[2] / "shared" / "data"  # ../shared/data beside the checkout
WORDS = ["million", "thousand", "dozen", "etc.", "or more", "approximately", "at least", "maybe", "feet", "inches"]
WORDS += ["cm", "meters", "percent", "degrees", "dollars", "times", "squared", "half", "total", "units", "not"]


def generated_attacks(rows: list[dict], seed: int = 1) -> list[tuple[str, dict]]:
    """16 wrong answers built around each single-value gold g of `rows` (h: another record's gold, w: a
    word): g with a word after it, h or g in brackets, h = g, g == g, g and h, (z = g), a box before g,
    g with h after a line break... Each is wrong, except g followed by a unit the question asks for."""
    rng = random.Random(seed)
    singles = []
    for r in rows:
        gold = task.normalize(r["answer"])
        if task._is_text_answer(gold) or "\\approx" in gold:
            continue
        values, _ = task._gold_values(gold, r["problem"])
        if values and len(values) == 1 and not values[0].unit and task.parse(list(values[0].tokens)) is not None:
            singles.append(r)
    attacks = []
    for r in singles:
        g, h, w = (
            r["answer"],
            rng.choice([o["answer"] for o in singles if o["answer"] != r["answer"]]),
            rng.choice(WORDS),
        )
        shapes = [f"{g} \\text{{ {w}}}", f"({h} \\text{{ or }} {g})", f"\\left[{h}, {g}\\right]", f"\\{{{g}\\}}"]
        shapes += [f"{g} \\text{{ (or }} {h}\\text{{)}}", f"{h} = {g}", f"{g} == {g}", f"{g}, {h}", f"(z = {g})"]
        shapes += [f"{g} \\text{{ and }} {h}", f"\\boxed{{{h}}} {g}", f"{g}\\text{{, }}{h}", f"{g} \\quad {h}"]
        shapes += [f"{g} \\\\ {h}", f"{g}?", f"{g} \\ldots"]
        attacks += [(shape, r) for shape in shapes]
    return attacks


@pytest.mark.slow
def test_generated_attacks_on_every_math500_answer_score_zero():
    if not (DATA / "math500" / "test.jsonl").is_file():
        pytest.skip(f"benchmark data not found at {DATA} (the ../shared/data folder beside the checkout)")
    rows = [json.loads(line) for line in (DATA / "math500" / "test.jsonl").read_text().splitlines()]
    attacks = generated_attacks(rows)
    assert len(attacks) > 7000
    scored = [(pred, r) for pred, r in attacks if task.reward(f"So it is $\\boxed{{{pred}}}$.", r) == 1.0]
    for pred, r in scored:  # only the gold with a unit its question asks for
        unit = pred.removeprefix(r["answer"]).strip()
        assert unit.startswith("\\text{") and set(task._unit_key(unit[6:-1], False)) <= task._asked_units(r["problem"])
    assert len(scored) < 10
