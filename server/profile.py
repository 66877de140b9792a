# The schema preview of a session file (GET ...?profile=1): run by sandboxd
# in a single-use, read-only sandbox of the session's policy, never in the
# worker (the file is untrusted, and so are pandas' parsers on it). It prints
# ONE JSON document on stdout and nothing else:
#   {"rows", "column_count", "columns": [{"name", "dtype", "nulls",
#    "distinct"?, "sample"}], "head", "truncated"}
# or, when the file cannot be profiled, {"error": message, "kind":
# "unsupported" | "parse"}. Everything is bounded (columns, head rows,
# samples, cell text, distinct values tracked, the document's size), so the
# worker's bounded read never cuts it. The worker appends the call:
#   _sandboxd_profile(path, kind, limits)
import json
import math


def _sandboxd_profile(path, kind, lim):
    def out(doc):
        print(json.dumps(doc, ensure_ascii=False, allow_nan=False, default=str))

    def fail(k, msg):
        out({"error": str(msg)[: lim["max_cell"] * 4], "kind": k})

    try:
        import pandas as pd
    except Exception as e:  # noqa: BLE001 - any import failure is the answer
        return fail("unsupported", "pandas cannot be imported in the runtime image: %s" % e)

    def cell(v):
        # JSON has no NaN, and the worker keeps text short.
        try:
            if v is None or pd.isna(v):
                return None
        except (TypeError, ValueError):
            pass
        if hasattr(v, "item") and not hasattr(v, "__len__"):
            v = v.item()  # a numpy scalar: its Python value
        if isinstance(v, bool):
            return v
        if isinstance(v, int) and abs(v) < 2**53:
            return v
        if isinstance(v, float) and math.isfinite(v):
            return v
        s = str(v)
        return s if len(s) <= lim["max_cell"] else s[: lim["max_cell"]] + "…"

    def frames():
        if kind == "csv":
            header = pd.read_csv(path, nrows=0)
            names = list(header.columns)
            use = list(range(min(len(names), lim["max_columns"])))
            yield len(names), header.iloc[:, use]
            yield from pd.read_csv(path, usecols=use, chunksize=lim["chunk_rows"], low_memory=False)
            return
        if kind == "xlsx":
            df = pd.read_excel(path, sheet_name=0)
        elif kind == "json":
            try:
                df = pd.read_json(path)
            except ValueError:
                df = pd.read_json(path, lines=True)
        elif kind == "parquet":
            try:
                df = pd.read_parquet(path)
            except ImportError as e:
                raise LookupError(
                    "reading Parquet needs pyarrow or fastparquet, which the runtime image does not have (%s)" % e
                )
        else:
            raise LookupError("no profiler for %r files" % kind)
        df = df.iloc[:, : lim["max_columns"]]
        yield len(df.columns), df.iloc[:0]
        yield df

    try:
        it = frames()
        total_columns, empty = next(it)
        rows = 0
        cols = None
        head = []
        for chunk in it:
            if cols is None:
                cols = [
                    {"name": cell(str(c)), "dtypes": [], "nulls": 0, "seen": set(), "sample": []}
                    for c in chunk.columns
                ]
            rows += len(chunk)
            if len(head) < lim["head_rows"]:
                for row in chunk.head(lim["head_rows"] - len(head)).itertuples(index=False):
                    head.append([cell(v) for v in row])
            for c, col in zip(cols, [chunk.iloc[:, i] for i in range(len(cols))]):
                dt = str(col.dtype)
                if dt not in c["dtypes"]:
                    c["dtypes"].append(dt)
                c["nulls"] += int(col.isna().sum())
                if c["seen"] is None and len(c["sample"]) >= lim["samples"]:
                    continue
                try:
                    values = pd.unique(col.dropna())
                except TypeError:  # unhashable cells (lists in JSON)
                    values = col.dropna().astype(str).unique()
                for v in values:
                    if len(c["sample"]) < lim["samples"]:
                        text = cell(v)
                        if text not in c["sample"]:
                            c["sample"].append(text)
                    if c["seen"] is not None:
                        try:
                            c["seen"].add(hash(v))
                        except TypeError:
                            c["seen"].add(hash(str(v)))
                        if len(c["seen"]) > lim["max_distinct"]:
                            c["seen"] = None  # too many to count: no "distinct"
                    elif len(c["sample"]) >= lim["samples"]:
                        break
    except LookupError as e:
        return fail("unsupported", e)
    except Exception as e:  # noqa: BLE001 - the parser's message is the answer
        return fail("parse", "%s: %s" % (type(e).__name__, e))

    if cols is None:  # no rows: the header's columns
        cols = [
            {"name": cell(str(c)), "dtypes": [str(t)], "nulls": 0, "seen": set(), "sample": []}
            for c, t in zip(empty.columns, empty.dtypes)
        ]
    columns = []
    for c in cols:
        d = {
            "name": c["name"],
            "dtype": c["dtypes"][0] if len(c["dtypes"]) == 1 else "mixed(" + ",".join(c["dtypes"]) + ")",
            "nulls": c["nulls"],
            "sample": c["sample"],
        }
        if c["seen"] is not None:
            d["distinct"] = len(c["seen"])
        columns.append(d)
    doc = {
        "rows": rows,
        "column_count": total_columns,
        "columns": columns,
        "head": head,
        "truncated": total_columns > len(columns),
    }
    # Within the budget: fewer head rows first, then fewer columns.
    while len(json.dumps(doc, ensure_ascii=False, default=str).encode()) > lim["max_bytes"]:
        if doc["head"]:
            doc["head"] = doc["head"][: len(doc["head"]) // 2]
        elif doc["columns"]:
            doc["columns"] = doc["columns"][: len(doc["columns"]) // 2]
            doc["truncated"] = True
        else:
            break
    out(doc)
