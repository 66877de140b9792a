#!/usr/bin/env python3
"""A self-healing agent loop against sandboxd, with a script instead of a model.

An analyst agent posts pandas code, reads the typed error when it fails
(error.type, .line, .hint, .text), posts a corrected script, and repeats
until the code succeeds; then it shows the chart the code drew. Here the
"model" is a scripted fixer: one rule per error type (SyntaxError, KeyError
on a DataFrame column, NameError, ZeroDivisionError) that patches the
script using only what the worker's typed error says. The analysis starts
with four bugs, so the loop runs five times.

    SANDBOXD_URL=http://127.0.0.1:3100 SANDBOXD_TOKEN=... python3 agent_loop.py --out chart.png

Standard library only, plus the sandboxd client module
(tools/clients/python/sandboxd.py), imported from its place in the
repository. README.md next to this file explains the output.

Exit status: 0 when the code succeeded and its chart was written, 1 when
the loop gave up (no rule for the error, no typed error, the step limit,
no chart), 2 when the worker could not be used (unreachable, a refusal)
or a local file could not be read or written.
"""

import argparse
import ast
import difflib
import io
import json
import os
import re
import sys
import tokenize

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, os.pardir, "clients", "python"))

import sandboxd  # noqa: E402  (found through the path above)

DEFAULT_CSV = os.path.join(_HERE, "sales.csv")
UPLOAD_PATH = "input/sales.csv"  # relative to the session's /workspace (its cwd)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# The agent's first attempt: the analysis of sales.csv with four bugs, which
# the worker reports one at a time (a script that does not compile runs
# nothing; after that, the first exception stops it):
#   line 21  a ')' left open                     -> SyntaxError
#   line 11  the column is 'region', not 'Region' -> KeyError (hint: the columns)
#   line  7  west sold nothing in January         -> ZeroDivisionError (in growth)
#   line 17  a typo in a variable's name          -> NameError
# The chart is not saved by the code: the worker captures the open figure
# as figure-1.png. The last line is a final expression: its value comes
# back as a display (a markdown table).
BROKEN_ANALYSIS = '''\
import pandas as pd
import matplotlib.pyplot as plt


def growth(first, last):
    """Percent change from the first month to the last."""
    return (last - first) / first * 100


sales = pd.read_csv("input/sales.csv", parse_dates=["month"])
sales["region"] = sales["Region"].str.title()
total_revenue = sales["revenue"].sum()
monthly = sales.pivot_table(index="month", columns="region", values="revenue", aggfunc="sum")
for region in monthly.columns:
    first, last = float(monthly[region].iloc[0]), float(monthly[region].iloc[-1])
    print(f"{region:>6}: {growth(first, last):+6.1f} % since {monthly.index[0]:%B}")
print("total revenue:", round(totl_revenue))

ax = monthly.plot(title="Revenue by region", marker="o", figsize=(8, 4.5))
ax.set_xlabel("month")
ax.set_ylabel("revenue (EUR)"
monthly.sum().round().sort_values(ascending=False)
'''


# ---------------------------------------------------------------------------
# The fixer: error type -> patched script. Each rule takes the script and
# the worker's typed error (sandboxd.ExecutionError) and returns the
# patched script and a sentence saying what it changed, or None when it
# cannot fix this error. A rule uses only the error's fields, as a model
# would read them; error.line is the failing line of the user's code.


def fix(script, error):
    """The patched script and what was changed, or None: no rule fits."""
    rule = RULES.get(error.type)
    if rule is None:
        return None
    return rule(script, error)


def _line(script, n):
    """Line n (1-based) of script without its end, or None."""
    lines = script.splitlines()
    if not isinstance(n, int) or not 1 <= n <= len(lines):
        return None
    return lines[n - 1]


def _replace_line(script, n, text):
    lines = script.splitlines(keepends=True)
    end = lines[n - 1][len(lines[n - 1].rstrip("\r\n")):]
    lines[n - 1] = text + end
    return "".join(lines)


_CLOSERS = {"(": ")", "[": "]", "{": "}"}


def fix_syntax_error(script, error):
    """An opening bracket never closed: close it at the end of its line
    (error.offset points at it). A missing ':' after a def, if, for...:
    add it."""
    line = _line(script, error.line)
    if line is None:
        return None
    m = re.fullmatch(r"'([(\[{])' was never closed", error.message)
    if m:
        opener = m.group(1)
        if error.offset is not None and line[error.offset - 1:error.offset] != opener:
            return None
        closed = line.rstrip() + _CLOSERS[opener]
        return _replace_line(script, error.line, closed), \
            f"close the {opener!r} left open on line {error.line}"
    if error.message == "expected ':'":
        return _replace_line(script, error.line, line.rstrip() + ":"), \
            f"add the ':' missing at the end of line {error.line}"
    return None


def _hint_candidates(hint):
    """The columns a KeyError's hint proposes ("Did you mean 'a' or 'b'?"),
    then all the columns it lists ("Its 4 columns: 'a', 'b', ..."), as
    Python values (the hint writes them as reprs)."""
    lit = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
    proposed, listed = [], []
    m = re.search(r"Did you mean ((?:%s)(?: or %s)*)\?" % (lit, lit), hint)
    if m:
        proposed = [ast.literal_eval(s) for s in re.findall(lit, m.group(1))]
    m = re.search(r"columns: (.*)$", hint, re.S)
    if m:
        listed = [ast.literal_eval(s) for s in re.findall(lit, m.group(1))]
    return proposed, listed


def fix_key_error(script, error):
    """A column that does not exist: use the one the hint proposes, or the
    closest of the columns it lists, in the string literals of the failing
    line."""
    try:
        key = ast.literal_eval(error.message)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(key, str) or not error.hint:
        return None  # without the worker's hint, this fixer does not guess
    proposed, listed = _hint_candidates(error.hint)
    if not proposed:
        folded = [c for c in listed if c.lower() == key.lower()]
        proposed = folded or difflib.get_close_matches(key, listed, n=1)
    if not proposed:
        return None
    new = proposed[0]
    patched = _replace_string_literal(script, error.line, key, new)
    if patched is None:
        return None
    return patched, f"column {key!r} does not exist: use {new!r} (from the error's hint)"


def _replace_string_literal(script, n, old, new):
    """script with the string literals equal to old on line n written as
    new (same quotes), or None when there is none."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(script).readline))
    except (tokenize.TokenError, SyntaxError):
        return None
    hits = []
    for tok in tokens:
        if tok.type != tokenize.STRING or tok.start[0] != n or tok.end[0] != n:
            continue
        try:
            if ast.literal_eval(tok.string) != old:
                continue
        except (ValueError, SyntaxError):
            continue  # an f-string
        hits.append(tok)
    if not hits:
        return None
    line = _line(script, n)
    for tok in reversed(hits):  # right to left: columns stay valid
        quote = tok.string[-1]
        lit = quote + new + quote if quote not in new and "\\" not in new else repr(new)
        line = line[:tok.start[1]] + lit + line[tok.end[1]:]
    return _replace_line(script, n, line)


# Names an analyst uses without defining them: a NameError on one of these
# is a missing import.
KNOWN_IMPORTS = {
    "pd": "import pandas as pd",
    "np": "import numpy as np",
    "plt": "import matplotlib.pyplot as plt",
    "math": "import math",
    "json": "import json",
}


def fix_name_error(script, error):
    """An undefined name: import it when it is a known alias (np, pd...);
    else rename it on the failing line to Python's suggestion ("Did you
    mean: ...?" in error.text), or to the closest name the script defines."""
    m = re.fullmatch(r"name '(\w+)' is not defined(?:\. Did you mean: '(\w+)'\?)?", error.message)
    if not m:
        return None
    name = m.group(1)
    if name in KNOWN_IMPORTS:
        return KNOWN_IMPORTS[name] + "\n" + script, f"{name!r} is not defined: add `{KNOWN_IMPORTS[name]}`"
    s = m.group(2) or _suggestion(error.text, name)
    how = "Python's suggestion"
    if s is None:
        close = difflib.get_close_matches(name, sorted(_defined_names(script)), n=1)
        if not close:
            return None
        s, how = close[0], "the closest name the script defines"
    line = _line(script, error.line)
    if line is None:
        return None
    renamed = re.sub(r"\b%s\b" % re.escape(name), s, line)
    if renamed == line:
        return None
    return _replace_line(script, error.line, renamed), f"{name!r} is not defined: use {s!r} ({how})"


def _suggestion(text, name):
    """The name Python suggests for name in a traceback's text."""
    m = re.search(r"NameError: name '%s' is not defined\. Did you mean: '(\w+)'\?" % re.escape(name), text or "")
    return m.group(1) if m else None


def _defined_names(script):
    try:
        tree = ast.parse(script)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


_DIVISIONS = (ast.Div, ast.FloorDiv, ast.Mod)


def fix_zero_division(script, error):
    """A division by zero: on the failing line, each division by something
    that is not a non-zero constant gives NaN when its divisor is 0."""
    try:
        tree = ast.parse(script)
    except SyntaxError:
        return None
    n = error.line
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, _DIVISIONS)):
            continue
        if node.lineno != n or node.end_lineno != n:
            continue
        if isinstance(node.right, ast.Constant) and node.right.value:
            continue
        if any(o.col_offset <= node.col_offset and node.end_col_offset <= o.end_col_offset for o in found):
            continue  # inside a division already guarded
        found.append(node)
    if not found:
        return None
    # ast's columns count UTF-8 bytes.
    line = _line(script, n).encode("utf-8")
    for node in sorted(found, key=lambda o: o.col_offset, reverse=True):
        expr = ast.get_source_segment(script, node)
        divisor = ast.get_source_segment(script, node.right)
        guarded = f'({expr} if {divisor} else float("nan"))'.encode("utf-8")
        line = line[:node.col_offset] + guarded + line[node.end_col_offset:]
    divisors = ", ".join(f"`{ast.get_source_segment(script, o.right)}`" for o in found)
    return _replace_line(script, n, line.decode("utf-8")), \
        f"division by zero on line {n}: NaN when {divisors} is 0"


RULES = {
    "SyntaxError": fix_syntax_error,
    "KeyError": fix_key_error,
    "NameError": fix_name_error,
    "ZeroDivisionError": fix_zero_division,
}


# ---------------------------------------------------------------------------
# The loop


class Transcript:
    """What happened, printed as it happens and kept for --json."""

    def __init__(self, out, verbose=False):
        self.out, self.verbose = out, verbose
        self.doc = {"steps": [], "outcome": None, "reason": None, "chart": None}

    def say(self, text="", indent=0):
        pad = " " * indent
        for line in (text.splitlines() or [""]):
            print(pad + line, file=self.out)
        self.out.flush()

    def step(self, n, ex):
        rec = {"step": n, "execution_id": ex.id, "status": ex.status, "exit_code": ex.exit_code,
               "display": [d.markdown or d.text for d in ex.display]}
        err = ex.error
        if err is not None:
            rec["error"] = {"type": err.type, "message": err.message, "line": err.line,
                            "offset": err.offset, "hint": err.hint}
            where = f" at line {err.line}" if err.line else ""
            self.say(f"step {n}: {ex.status}: {err.type}{where}: {err.message}")
            if err.hint:
                self.say(f"hint: {err.hint}", 2)
            if self.verbose:
                self.say(err.text.rstrip("\n"), 4)
        else:
            self.say(f"step {n}: {ex.status}" + (f": {ex.error_message}" if ex.error_message else ""))
            if ex.stderr:  # what there is to read without a typed error
                self.say("\n".join(ex.stderr.rstrip("\n").splitlines()[-5:]), 4)
        self.doc["steps"].append(rec)
        return rec

    def fixed(self, rec, before, after, what):
        rec["fix"] = what
        self.say(f"fix: {what}", 2)
        diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        for d in list(diff)[2:]:  # without the ---/+++ header
            if not d.startswith("@@"):
                self.say(d, 4)

    def end(self, outcome, reason=None):
        self.doc["outcome"], self.doc["reason"] = outcome, reason
        if reason:
            self.say(f"gave up: {reason}" if outcome == "gave_up" else reason)


def run_loop(client, script, csv_path, out_path, max_steps, t):
    """Create a session, upload the CSV, run script until it succeeds
    (patching it after each failure), write its chart to out_path. Returns
    the exit status."""
    with client.create_session() as s:  # deleted at the end, whatever happens
        t.doc["session_id"] = s.id
        info = s.upload(UPLOAD_PATH, csv_path)
        t.say(f"session {s.id}: uploaded {info.path} ({info.size} bytes)")
        for n in range(1, max_steps + 1):
            ex = s.run(script)
            rec = t.step(n, ex)
            if ex.ok:
                return _succeeded(ex, script, out_path, t)
            if ex.error is None:
                # A limit (timeout, oom...) or the worker's own failure is
                # no Python error: nothing for the fixer to read.
                t.end("gave_up", f"{ex.status} without a typed error (exit code {ex.exit_code})")
                return 1
            if n == max_steps:
                break
            patched = fix(script, ex.error)
            if patched is None:
                t.end("gave_up", f"no rule fixes this {ex.error.type}")
                return 1
            t.fixed(rec, script, patched[0], patched[1])
            script = patched[0]
        t.end("gave_up", f"still failing after {max_steps} steps")
        return 1


def _succeeded(ex, script, out_path, t):
    t.doc["script"] = script
    if ex.stdout:
        t.say(ex.stdout.rstrip("\n"), 2)
    for d in ex.display:
        t.say(d.markdown or d.text, 2)
    chart = pick_chart(ex)
    if chart is None:
        t.end("no_chart", "the code succeeded but returned no PNG chart")
        return 1
    data = chart.data  # base64-decoded, its SHA-256 checked by the client
    if not data.startswith(PNG_SIGNATURE):
        t.end("no_chart", f"{chart.name} is not a PNG")
        return 1
    with open(out_path, "wb") as f:
        f.write(data)
    t.doc["chart"] = {"artifact": chart.name, "path": out_path, "bytes": len(data),
                      "width": chart.width, "height": chart.height}
    t.end("succeeded")
    t.say(f"chart: {chart.name} ({chart.width}x{chart.height} px, {len(data)} bytes) -> {out_path}")
    return 0


def pick_chart(ex):
    """The chart: the first captured figure (figure-1.png), else the first
    PNG the code saved under output/artifacts/."""
    pngs = [a for a in ex.artifacts if a.media_type == "image/png" or a.name.lower().endswith(".png")]
    for a in pngs:
        if re.fullmatch(r"figure-\d+\.png", a.name):
            return a
    return pngs[0] if pngs else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="the worker (default $SANDBOXD_URL, else http://127.0.0.1:3100)")
    p.add_argument("--token", help="the worker's token (default $SANDBOXD_TOKEN)")
    p.add_argument("--out", default="chart.png", help="where the chart goes (default chart.png)")
    p.add_argument("--csv", default=DEFAULT_CSV, help="the data, uploaded as input/sales.csv")
    p.add_argument("--script", help="start from this script instead of the built-in broken analysis")
    p.add_argument("--max-steps", type=int, default=6, help="executions before giving up (default 6)")
    p.add_argument("--json", metavar="PATH", help="also write the transcript as JSON to PATH")
    p.add_argument("-v", "--verbose", action="store_true", help="print each traceback as Python printed it")
    args = p.parse_args(argv)
    if args.max_steps < 1:
        p.error("--max-steps must be at least 1")
    script = BROKEN_ANALYSIS
    if args.script:
        with open(args.script, encoding="utf-8") as f:
            script = f.read()

    client = sandboxd.Client.from_env()
    if args.url or args.token:
        client = sandboxd.Client(args.url or client.base_url, token=args.token or client.token)
    t = Transcript(sys.stdout, args.verbose)
    t.say(f"agent loop against {client.base_url}")
    try:
        status = run_loop(client, script, args.csv, args.out, args.max_steps, t)
    except (sandboxd.SandboxdError, OSError) as e:
        t.end("error", f"error: {e}")
        status = 2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(t.doc, f, indent=2)
            f.write("\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
