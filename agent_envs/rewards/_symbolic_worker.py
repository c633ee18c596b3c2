"""Symbolic equivalence worker: one JSON request per stdin line, one JSON reply per stdout line.

Run by `agent_envs.rewards.symbolic` as a plain script (never imported into the caller's
process), so a runaway sympy computation can be killed with the process. It imports nothing from
the package, which keeps its start-up short.

    $ echo '{"id": 1, "pred": "\\\\sqrt{8}", "golds": ["2\\\\sqrt{2}"]}' | python _symbolic_worker.py
"""

from __future__ import annotations

import json
import logging
import sys


def _mv_parse(s: str):
    from math_verify import parse

    out = parse(f"${s}$", parsing_timeout=None)
    return out if out else parse(s, parsing_timeout=None)


def _sympy_expr(s: str):
    import sympy
    from latex2sympy2_extended import latex2sympy
    from sympy.parsing.sympy_parser import (
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    try:
        return latex2sympy(s)
    except Exception:
        return parse_expr(
            s.replace("^", "**"),
            transformations=(*standard_transformations, implicit_multiplication_application),
            evaluate=True,
            local_dict={"e": sympy.E, "pi": sympy.pi},
        )


def _sympy_equal(pred: str, gold: str) -> bool:
    import sympy

    a, b = _sympy_expr(pred), _sympy_expr(gold)
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        return sympy.simplify(a - b) == 0
    return bool(a == b)


def check(pred: str, golds: list[str]) -> dict:
    from math_verify import verify

    errors = []
    p = None
    try:
        p = _mv_parse(pred)
    except Exception as e:
        errors.append(f"math_verify parse: {type(e).__name__}: {e}")
    for g in golds:
        try:
            gp = _mv_parse(g)
            if p and gp:
                if verify(gp, p, timeout_seconds=None):
                    return {"match": g, "method": "math_verify"}
                continue  # both parsed: math-verify's "no" stands; sympy would not know better
        except Exception as e:
            errors.append(f"math_verify: {type(e).__name__}: {e}")
        try:
            if _sympy_equal(pred, g):
                return {"match": g, "method": "sympy"}
        except Exception as e:
            errors.append(f"sympy: {type(e).__name__}: {str(e)[:200]}")
    # a parse failure on one side is an ordinary "not equivalent", not a grader error
    return {"match": None, "method": "symbolic", "notes": errors[:3]}


def main() -> None:
    logging.disable(logging.CRITICAL)  # math-verify logs parse failures; replies carry what matters
    import math_verify  # noqa: F401  (import before "ready", so timeouts measure work, not imports)
    import sympy  # noqa: F401

    check(
        "x^2+2x+1", ["(x+1)^2", "\\frac{\\sqrt{3}}{2}"]
    )  # first-use initialisation (parser tables) happens here
    sys.stdout.write('{"ready": true}\n')
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            reply = {"id": req["id"], **check(req["pred"], req["golds"])}
        except Exception as e:
            reply = {"id": None, "match": None, "method": "symbolic", "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
