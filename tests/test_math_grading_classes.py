"""MATH grading, class by class (rapid/tasks/math.py's docstring states the rules): a wrong answer of
each class scores 0 in several shapes, and correct answers in unusual but legitimate forms score 1.
Each answer goes through the full reward path: the completion's last box against the record."""

import pytest

from rapid.tasks import math as task

ONE = "What is the value of $x$?"
ALL = "Find all real solutions to the equation.  Enter all the solutions, separated by commas."
INCREASING = "Find the three integers.  Enter them in increasing order, separated by commas."
LENGTHS = "Find the lengths of $BP$ and $QT$.  Write your answer as two numbers."


def score(pred: str, gold: str, problem: str = ONE) -> float:
    record = {"problem": problem, "answer": gold, "grading": {"timeout_s": 60.0}}
    return task.reward(f"Hence the answer is $\\boxed{{{pred}}}$.", record)


def scores(cases) -> list[tuple]:
    """The cases whose score differs from the expected one (empty when all agree)."""
    return [case for case in cases if score(*case[:-1]) != case[-1]]


def test_a_hedge_between_candidates_never_scores():
    cases = [
        ("3 \\text{ or } 4", "3", 0.0),
        ("\\text{either } 3 \\text{ or } 4", "4", 0.0),
        ("5~\\text{or}~6", "5", 0.0),  # a non-breaking space around the word
        ("5 \\text{ or 6}", "5", 0.0),  # the alternative hidden in what looks like a unit
        ("5 \\text{ or more}", "5", 0.0),
        ("3, 4", "3", 0.0),  # several values where one is asked
        ("3; 4", "4", 0.0),
        ("5 \\quad 6", "5", 0.0),
        ("5 6", "56", 0.0),  # juxtaposed numbers are two values, not 56
        ("5\\;6", "30", 0.0),  # nor 5 * 6
        ("\\frac12 \\text{ and } \\frac13", "\\frac12", 0.0),
        ("x = 3 \\text{ or } x = 4", "3", 0.0),
        ("3 \\pm 1", "4", 0.0),
        ("\\sqrt{2} \\text{ probably}", "\\sqrt{2}", 0.0),
        ("(C) \\text{ or } (D)", "\\text{(C)}", 0.0),
        ("CD", "\\text{(C)}", 0.0),
        ("\\text{C or D}", "C", 0.0),
        ("\\text{Sunday or Monday}", "\\text{Sunday}", 0.0),
        ("(2,3) \\text{ or } (3,2)", "(2,3)", 0.0),
        ("5\\hspace{1em}6", "5", 0.0),
        ("5 \\\\ 6", "6", 0.0),  # a line break
        ("5?", "5", 0.0),
        ("x \\approx 5", "5", 0.0),  # a relation other than equality
        ("\\approx 5", "5", 0.0),
        ("x \\to 5", "5", 0.0),
        ("\\ge 5", "5", 0.0),
        ("3 \\ldots", "3", 0.0),
        ("\\sout{6} 5", "5", 0.0),  # markup that hides a second value
        ("5 \\tag{6}", "5", 0.0),
        ("\\hbox{6} 5", "5", 0.0),
        ("\\textcolor{white}{6} 5", "5", 0.0),
        ("\\text{(A)}\\text{ B}", "\\text{(A)}", 0.0),  # a second choice where a unit would be
        ("A \\text{ B}", "A", 0.0),
        # the gold's own alternatives are a list of values, not a hedge
        ("-12, -2", "-2 \\text{ or } -12", ALL, 1.0),
        ("3", "3", ONE, 1.0),
    ]
    assert scores(cases) == []


def test_a_false_equation_or_one_about_another_variable_never_scores():
    cases = [
        ("2+2=5", "5", 0.0),  # the right-hand side is the gold, the equation is false
        ("7 + 4 = 12", "12", 0.0),
        ("x = 1 = 5", "5", 0.0),
        ("\\frac13 = \\frac12", "\\frac12", 0.0),
        ("2^{3} = 9", "9", 0.0),
        ("3 = 5", "5", 0.0),
        ("y = 5", "x=5", 0.0),  # another variable than the gold's
        ("n = 6", "k=6", 0.0),
        ("x = 2x + 3", "y=2x+3", 0.0),
        ("a = -4", "b = -4", 0.0),
        ("CD = 9", "AB=9", 0.0),
        # true statements of the answer score
        ("2^{10} = 1024", "1024", 1.0),
        ("x = 2 + 3 = 5", "5", 1.0),
        ("n = 7", "7", "Find the integer $n$ with $2n = 14$.", 1.0),
        ("n = 7", "7", 0.0),  # the problem has no n
        ("x = 5", "x=5", 1.0),
        ("5", "x=5", 1.0),
        ("y = 3 + 2x", "y=2x+3", 1.0),
        ("b = -4", "b = -4", 1.0),
    ]
    assert scores(cases) == []


def test_a_list_is_not_one_number_and_all_solutions_may_come_in_any_order():
    cases = [
        ("70, 110", "70110", ONE, 0.0),  # a list read as a number with thousands separators
        ("1, 100", "1100", ONE, 0.0),
        ("12, 345", "12345", ONE, 0.0),
        ("1,\\ 000", "1000", ONE, 0.0),
        ("5 000", "5000", ONE, 0.0),
        ("634,98", "98,634", ONE, 0.0),  # 98,634 is one number: not a list to reorder
        ("70110", "70,110", ALL, 0.0),  # 70,110 answers "enter all the solutions": two values
        ("110,70", "70,110", ALL, 1.0),  # all solutions, in another order
        ("110, 70", "70,110", ALL, 1.0),
        ("256, 81", "81, 256", ALL, 1.0),
        ("256,81", "81, 256", ALL, 1.0),
        ("4, 2, 3", "2, 3, \\text{ and } 4", ALL, 1.0),
        ("1 - \\sqrt{2}, 1 + \\sqrt{2}", "1 + \\sqrt{2}, 1 - \\sqrt{2}", ALL, 1.0),
        ("1-\\sqrt{19}, 1+\\sqrt{19}", "1 \\pm \\sqrt{19}", ALL, 1.0),
        ("81", "81, 256", ALL, 0.0),  # not all of them
        ("81, 256, 3", "81, 256", ALL, 0.0),
        ("81, 81", "81, 256", ALL, 0.0),
        ("4, 3, 2", "2, 3, 4", INCREASING, 0.0),  # an order was asked for
        ("2, 3, 4", "2, 3, 4", INCREASING, 1.0),
        ("9, 12", "12,9", LENGTHS, 0.0),  # two different quantities: their order matters
        ("98,634", "98634", ONE, 1.0),
        ("98634", "98,634", ONE, 1.0),
        ("1,000,000", "1,\\!000,\\!000", ONE, 1.0),
    ]
    assert scores(cases) == []


def test_a_rounded_decimal_is_not_the_exact_gold():
    cases = [
        ("0.333333", "\\frac{1}{3}", 0.0),
        ("0.000000", "\\frac{1}{10^7}", 0.0),  # a tiny fraction is not 0
        ("0.0", "\\frac{1}{3000000}", 0.0),
        ("0.0000001", "0", 0.0),
        ("1.414214", "\\sqrt{2}", 0.0),
        ("3.141593", "\\pi", 0.0),
        ("0.142857", "\\frac17", 0.0),
        ("(0.333333, 1)", "\\left(\\frac13, 1\\right)", 0.0),
        ("\\sqrt{2} + 10^{-20}", "\\sqrt{2}", 0.0),
        ("\\sqrt{2} + 10^{-100}", "\\sqrt{2}", 0.0),  # below any working precision
        ("\\pi + \\frac{1}{10^{70}}", "\\pi", 0.0),
        ("\\left(\\sqrt{3} + 10^{-90}, 1\\right)", "(\\sqrt{3}, 1)", 0.0),
        # a decimal that is the exact value scores
        ("0.5", "\\frac12", 1.0),
        ("2.50", "\\frac52", 1.0),
        ("(0.5, 1)", "\\left(\\frac12, 1\\right)", 1.0),
        ("0.25\\sqrt{2}", "\\frac{\\sqrt{2}}{4}", 1.0),
        ("8.24", "\\approx 8.24 \\text{ mph}", 1.0),
        ("0.67", "\\$\\dfrac23 \\approx \\$0.67", 1.0),
        ("\\frac{2}{3}", "\\$\\dfrac23 \\approx \\$0.67", 1.0),
        ("0.66", "\\$\\dfrac23 \\approx \\$0.67", 0.0),
        ("\\sqrt{3 + 2\\sqrt{2}}", "1 + \\sqrt{2}", 1.0),  # equal, though not the same spelling
        ("\\cos \\frac{\\pi}{12}", "\\frac{\\sqrt{6} + \\sqrt{2}}{4}", 1.0),
    ]
    assert scores(cases) == []


def test_choices_and_words_compare_as_text():
    cases = [
        ("\\text{ABDC}", "\\text{CBAD}", 0.0),  # as a product of symbols these are equal
        ("\\text{yadnuS}", "\\text{Sunday}", 0.0),
        ("\\text{odd}", "\\text{even}", 0.0),
        ("\\text{(D)}", "\\text{(C)}", 0.0),
        ("c", "\\text{(C)}", 0.0),
        ("\\text{sunday}", "\\text{Sunday}", 1.0),
        ("C", "\\text{(C)}", 1.0),
        ("\\textbf{(C)}", "C", 1.0),
        ("\\text{CBAD}", "\\text{CBAD}", 1.0),
        ("12_3", "12", 0.0),  # a numeral in base 3 is five
        ("12_{3}", "5", 0.0),
        ("11", "1011_2", 0.0),  # the base asked for
        ("1011_{2}", "1011_2", 1.0),
        ("\\text{A5}_{11}", "\\text{A5}_{11}", 1.0),
    ]
    assert scores(cases) == []


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("2\\frac{1}{2}", "\\frac{5}{2}"),  # mixed numbers, both ways
        ("\\frac52", "2\\frac{1}{2}"),
        ("-15\\frac{3}{5}", "-\\frac{78}{5}"),
        ("11 \\frac{2}{3}", "\\frac{35}{3}"),
        ("10", "10\\text{ inches}"),  # units
        ("864 \\text{ square inches}", "864"),
        ("5.4 \\text{ cents}", "5.4"),
        ("25 \\text{ km}", "25 \\, \\text{km}"),
        ("18\\text{integers}", "18 \\text{ integers}"),
        ("14 \\text{ right triangles} \\text{ total}", "14"),
        ("\u22125", "-5"),  # a unicode minus
        ("\u2212\\frac{1}{2}", "-\\frac12"),
        ("2^{10}", "1024"),  # a power written out
        ("2^{10}", "1,\\!024"),
        ("\\dfrac{3}{8}", "\\dfrac 3 8"),
        ("\\tfrac{1}{2}", "0.5"),
        ("\\text{5}", "5"),  # text wrappers
        ("\\mbox{Evelyn}", "\\text{Evelyn}"),
        ("\\$18.90", "18.9"),
        ("50\\%", "50"),
        ("90^\\circ", "90"),
        ("10\\,000", "10{,}000"),  # thin-space thousands
        ("x = \\frac{1}{67}", "x=\\frac{1}{67}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
        ("[-2, 7]", "x \\in [-2,7]"),
        ("\\mathbf{5}", "5"),
        ("\\log_2 8", "3"),
        ("\\{7, 5, 4\\}", "\\{4,5,7\\}"),
        ("4, 5, 7", "\\{4,5,7\\}"),
    ],
)
def test_correct_answers_in_unusual_forms_score(pred, gold):
    assert score(pred, gold, QUESTIONS.get(pred, ONE)) == 1.0


# a unit the gold lacks is allowed where the question asks for it (rule 5)
QUESTIONS = {
    "864 \\text{ square inches}": "What is the area of the rug, in square inches?",
    "5.4 \\text{ cents}": "How many cents does one pencil cost?",
    "14 \\text{ right triangles} \\text{ total}": "How many right triangles are there in total?",
    "\\$18.90": "How many dollars does the meal cost?",
    "50\\%": "What percent of the votes did she win?",
    "90^\\circ": "What is the measure of angle $B$, in degrees?",
}


def test_a_box_without_braces_counts():
    assert task.reward("so the answer is $\\boxed 9$.", {"answer": "9"}) == 1.0
    assert task.reward("so the answer is $\\boxed 8$.", {"answer": "9"}) == 0.0
