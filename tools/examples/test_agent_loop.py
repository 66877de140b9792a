"""The scripted fixer of agent_loop.py, without a worker: each rule on the
typed errors the worker reports (shapes as server/runner/runner.py writes
them), and the whole chain of fixes on the built-in broken analysis.

    python3 -m unittest -v test_agent_loop
"""

import math
import unittest

import agent_loop as al
import sandboxd


def err(type, message, line, **kw):
    return sandboxd.ExecutionError(type=type, message=message, line=line, **kw)


def line(script, n):
    return script.splitlines()[n - 1]


# The errors the worker reports for BROKEN_ANALYSIS, in the order they
# come (each after the previous one's fix).
SYNTAX = err("SyntaxError", "'(' was never closed", 21, offset=14)
KEY = err("KeyError", "'Region'", 11,
          hint="'Region' is not a column of the DataFrame. Did you mean 'region'? "
               "Its 4 columns: 'month', 'region', 'units', 'revenue'")
ZERO = err("ZeroDivisionError", "float division by zero", 7)
NAME = err("NameError", "name 'totl_revenue' is not defined", 17,
           text="Traceback (most recent call last):\n  File \"<cell 4>\", line 17, in <module>\n"
                "NameError: name 'totl_revenue' is not defined. Did you mean: 'total_revenue'?\n")

# The analysis as the worker runs it once it compiles (the fixer reads the
# script as Python: tokens, syntax tree).
COMPILING = al.BROKEN_ANALYSIS.replace('("revenue (EUR)"\n', '("revenue (EUR)")\n')


class SyntaxErrorRule(unittest.TestCase):
    def test_unclosed_bracket_is_closed_on_its_line(self):
        script, what = al.fix(al.BROKEN_ANALYSIS, SYNTAX)
        self.assertEqual(line(script, 21), 'ax.set_ylabel("revenue (EUR)")')
        self.assertIn("'('", what)
        compile(script, "<cell>", "exec")
        self.assertEqual(len(script.splitlines()), len(al.BROKEN_ANALYSIS.splitlines()))

    def test_offset_must_point_at_the_bracket(self):
        self.assertIsNone(al.fix(al.BROKEN_ANALYSIS, err("SyntaxError", "'(' was never closed", 21, offset=3)))

    def test_missing_colon(self):
        script, _ = al.fix("def f(x)\n    return x\n", err("SyntaxError", "expected ':'", 1, offset=9))
        self.assertEqual(script, "def f(x):\n    return x\n")

    def test_other_syntax_errors_are_not_guessed(self):
        self.assertIsNone(al.fix("x = = 1\n", err("SyntaxError", "invalid syntax", 1, offset=5)))

    def test_line_out_of_range(self):
        self.assertIsNone(al.fix("x = (\n", err("SyntaxError", "'(' was never closed", 7)))
        self.assertIsNone(al.fix("x = (\n", err("SyntaxError", "'(' was never closed", None)))


class KeyErrorRule(unittest.TestCase):
    def test_hint_proposal_replaces_the_literal_on_the_line(self):
        script, what = al.fix(COMPILING, KEY)
        self.assertEqual(line(script, 11), 'sales["region"] = sales["region"].str.title()')
        self.assertIn("'region'", what)

    def test_listed_columns_without_a_proposal(self):
        e = err("KeyError", "'Revenu'", 1, hint="'Revenu' is not a column of the DataFrame. "
                                                "Its 3 columns: 'month', 'units', 'revenue'")
        script, _ = al.fix("df['Revenu'].sum()\n", e)
        self.assertEqual(script, "df['revenue'].sum()\n")

    def test_no_hint_no_guess(self):
        self.assertIsNone(al.fix("df['Region']\n", err("KeyError", "'Region'", 1)))

    def test_key_not_on_the_line(self):
        self.assertIsNone(al.fix("x = 1\ndf['Region']\n", err("KeyError", "'Region'", 1, hint=KEY.hint)))

    def test_non_string_key(self):
        self.assertIsNone(al.fix("d[3]\n", err("KeyError", "3", 1, hint="3 is not a column. Its 1 columns: 'a'")))

    def test_quotes_in_column_names(self):
        proposed, listed = al._hint_candidates("'x' is not a column of the DataFrame. Did you mean \"it's\"? "
                                               "Its 2 columns: \"it's\", 'a, b'")
        self.assertEqual(proposed, ["it's"])
        self.assertEqual(listed, ["it's", "a, b"])


class NameErrorRule(unittest.TestCase):
    def test_pythons_suggestion_from_the_text(self):
        script, what = al.fix(COMPILING, NAME)
        self.assertEqual(line(script, 17), 'print("total revenue:", round(total_revenue))')
        self.assertIn("Python's suggestion", what)

    def test_closest_defined_name_without_a_suggestion(self):
        script, what = al.fix("total = 1\nprint(totl)\n", err("NameError", "name 'totl' is not defined", 2))
        self.assertEqual(script, "total = 1\nprint(total)\n")
        self.assertIn("closest", what)

    def test_known_alias_is_imported(self):
        script, _ = al.fix("x = np.arange(3)\n", err("NameError", "name 'np' is not defined", 1))
        self.assertEqual(script, "import numpy as np\nx = np.arange(3)\n")

    def test_nothing_close(self):
        self.assertIsNone(al.fix("print(zzz)\n", err("NameError", "name 'zzz' is not defined", 1)))

    def test_whole_words_only(self):
        script, _ = al.fix("total = 1\nsubtotl = 2\nprint(totl, subtotl)\n",
                           err("NameError", "name 'totl' is not defined", 3))
        self.assertEqual(line(script, 3), "print(total, subtotl)")


class ZeroDivisionRule(unittest.TestCase):
    def test_division_gives_nan_for_a_zero_divisor(self):
        script, what = al.fix(COMPILING, ZERO)
        self.assertEqual(line(script, 7), '    return ((last - first) / first if first else float("nan")) * 100')
        self.assertIn("`first`", what)
        src = "\n".join(script.splitlines()[4:7]) + "\n"  # def growth
        ns = {}
        exec(compile(src, "<growth>", "exec"), ns)
        self.assertTrue(math.isnan(ns["growth"](0.0, 5.0)))
        self.assertEqual(ns["growth"](2.0, 3.0), 50.0)

    def test_several_divisions_and_non_ascii(self):
        s = "r = a / b + c // d + e / 2  # é\n"
        script, _ = al.fix("ü = 1; " + s, err("ZeroDivisionError", "division by zero", 1))
        self.assertEqual(script, 'ü = 1; r = (a / b if b else float("nan")) + (c // d if d else float("nan"))'
                                 ' + e / 2  # é\n')

    def test_nested_division_guarded_once(self):
        script, _ = al.fix("r = (a / b) / c\n", err("ZeroDivisionError", "division by zero", 1))
        self.assertEqual(script, 'r = ((a / b) / c if c else float("nan"))\n')

    def test_no_division_on_the_line(self):
        self.assertIsNone(al.fix("x = 1\ny = a / b\n", err("ZeroDivisionError", "division by zero", 1)))


class Chain(unittest.TestCase):
    def test_four_fixes_make_the_analysis_whole(self):
        script = al.BROKEN_ANALYSIS
        for e in (SYNTAX, KEY, ZERO, NAME):
            fixed = al.fix(script, e)
            self.assertIsNotNone(fixed, e.type)
            script = fixed[0]
        compile(script, "<cell>", "exec")
        changed = [i + 1 for i, (a, b) in enumerate(zip(al.BROKEN_ANALYSIS.splitlines(), script.splitlines()))
                   if a != b]
        self.assertEqual(changed, [7, 11, 17, 21])

    def test_compiling_is_the_analysis_with_its_syntax_fixed(self):
        self.assertEqual(al.fix(al.BROKEN_ANALYSIS, SYNTAX)[0], COMPILING)

    def test_unknown_error_type(self):
        self.assertIsNone(al.fix("x\n", err("ValueError", "bad", 1)))


class PickChart(unittest.TestCase):
    def art(self, name, media_type="image/png"):
        return sandboxd.Artifact(name=name, media_type=media_type)

    def test_captured_figure_first(self):
        ex = sandboxd.Execution(artifacts=[self.art("saved.png"), self.art("figure-1.png"), self.art("figure-2.png")])
        self.assertEqual(al.pick_chart(ex).name, "figure-1.png")

    def test_saved_png_without_a_captured_figure(self):
        ex = sandboxd.Execution(artifacts=[self.art("data.csv", "text/csv"), self.art("saved.png")])
        self.assertEqual(al.pick_chart(ex).name, "saved.png")

    def test_none(self):
        self.assertIsNone(al.pick_chart(sandboxd.Execution(artifacts=[self.art("a.svg", "image/svg+xml")])))


if __name__ == "__main__":
    unittest.main()
