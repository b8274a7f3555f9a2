#!/usr/bin/env python3
"""Turns the mixin's rendered expressions (jsonnet's output of queries.jsonnet, on stdin)
into queries.json, what tests/prometheus.rs evaluates (see README.md):

- `query`: the expression with the dashboard's variables set as for one node of a
  one-cluster Prometheus (`$cluster` empty, `$instance` any) and each comparison against a
  number made a `bool` one, so that a healthy node's alert expression returns its series
  (with 0) instead of nothing;
- `selectors`: every metric selector the expression reads (name and matchers), each
  evaluated on its own: a recording rule that joins kube-state-metrics' series (not on
  this cluster) still shows whether the node gives the series it reads.
"""
import json
import re
import sys

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan"}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                "count_values", "bottomk", "topk", "quantile"}
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[[^\]]*\]|[A-Za-z_:][A-Za-z0-9_:]*|\d+(?:\.\d+)?(?:e[+-]?\d+)?|\s+|.', re.S)


def substitute(expr):
    return expr.replace('"$cluster"', '""').replace('"$instance"', '".*"')


def selectors(expr):
    tokens = [t for t in TOKEN.findall(expr)]
    out, i, after_list_kw = [], 0, False
    while i < len(tokens):
        t = tokens[i]
        if re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", t):
            j = i + 1
            while j < len(tokens) and tokens[j].isspace():
                j += 1
            nxt = tokens[j] if j < len(tokens) else ""
            if t in LABEL_LISTS and nxt == "(":
                # skip the label list
                k = j
                while tokens[k] != ")":
                    k += 1
                i = k + 1
                continue
            if nxt == "(" or t.lower() in KEYWORDS or t in AGGREGATIONS:
                i += 1
                continue
            if nxt == "{":
                k = j
                while tokens[k] != "}":
                    k += 1
                out.append(t + "".join(tokens[j:k + 1]))
                i = k + 1
                continue
            out.append(t)
        i += 1
    seen = []
    for s in out:
        if s not in seen:
            seen.append(s)
    return seen


COMPARISON = re.compile(r'(>=|<=|==|!=|>|<)(\s*)(?=\(?\s*[0-9])')


def with_bool(expr):
    return COMPARISON.sub(lambda m: m.group(1) + " bool" + (m.group(2) or " "), expr)


def entry(source, expr):
    expr_v = substitute(expr)
    return {"source": source, "expr": expr, "query": with_bool(expr_v).strip(),
            "selectors": selectors(expr_v)}


data = json.load(sys.stdin)
# The recording rules, as a rule file Prometheus loads (JSON is YAML).
with open(sys.argv[1], "w") as f:
    json.dump({"groups": data["rule_groups"]}, f, indent=1)
    f.write("\n")
out = []
for a in data["alerts"]:
    out.append(entry(f"alert {a['group']}/{a['name']}", a["expr"]))
for r in data["rules"]:
    out.append(entry(f"rule {r['group']}/{r['name']}", r["expr"]))
for d in data["dashboard"]:
    out.append(entry(f"dashboard Kubelet/{d['panel']}", d["expr"]))
json.dump(out, sys.stdout, indent=1)
sys.stdout.write("\n")
