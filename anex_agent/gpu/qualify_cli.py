"""``anex-agent qualify [--json]``: check this server against the on-prem hardware rules.

Prints one row per rule (rule, scope, result, measured, required, detail) or, with
``--json``, the document :func:`anex_agent.gpu.qualify.qualify` returns (the same one
the agent sends as ``telemetry["qualification"]``).

Exit status:
    0  every rule passed
    1  at least one rule failed
    2  bad input (unknown flag or value)
    3  no rule failed, but some could not be checked (e.g. no NVIDIA driver here)
"""

from __future__ import annotations

import argparse
import json

from anex_agent.gpu.qualify import FAIL, PASS, evaluate, gather_facts

EXIT_PASS, EXIT_FAIL, EXIT_INCOMPLETE = 0, 1, 3


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON (for machines)")
    parser.add_argument("--form-factor", choices=("auto", "sxm", "pcie"), default="auto",
                        help="GPU form factor for the PCIe-lanes rule (default: guess from the GPU name)")
    parser.add_argument("--sys-root", default="/sys", help=argparse.SUPPRESS)


def render_table(result: dict) -> str:
    mark = {"pass": "PASS", "fail": "FAIL", "not_checked": "n/a"}
    rows = [("rule", "scope", "result", "measured", "required", "detail")]
    rows += [(c["id"], c["scope"], mark[c["status"]], c["measured"], c["required"], c["detail"]) for c in result["checks"]]
    widths = [max(len(str(r[i])) for r in rows) for i in range(5)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(str(cell).ljust(widths[j]) for j, cell in enumerate(row[:5])) + "  " + str(row[5]))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    verdict = {"pass": "PASS: this server meets every rule",
               "fail": "FAIL: this server does not meet the rules marked FAIL",
               "incomplete": "INCOMPLETE: no rule failed, but the rules marked n/a could not be checked"}[result["status"]]
    lines += ["", verdict, "(required: all on-prem systems; marketplace: to sell spare capacity)"]
    gpm_line = gpm_summary(result.get("summary", {}).get("gpm") or {})
    if gpm_line:
        lines += ["", gpm_line]
    return "\n".join(lines)


def gpm_summary(gpm: dict) -> str:
    """One line on the profiling metrics (NVML GPM): which GPUs have them, and what that means for the others."""
    if not gpm:
        return ""
    supported = [i for i, state in gpm.items() if state == "supported"]
    unsupported = [i for i, state in gpm.items() if state != "supported"]
    if not unsupported:
        return "GPU profiling metrics (NVML GPM, DCGM_FI_PROF_*): supported on every GPU"
    which = "every GPU" if not supported else "GPU " + ", ".join(unsupported)
    return (f"GPU profiling metrics (NVML GPM, DCGM_FI_PROF_*): not supported on {which} "
            "(they need a Hopper or newer GPU and a driver with GPM); those GPUs get no profiling metrics"
            + (f"; supported on GPU {', '.join(supported)}" if supported else ""))


def main(args: argparse.Namespace) -> int:
    form = None if args.form_factor == "auto" else args.form_factor
    result = evaluate(gather_facts(sys_root=args.sys_root, form_factor=form)).to_dict()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render_table(result))
    return {PASS: EXIT_PASS, FAIL: EXIT_FAIL}.get(result["status"], EXIT_INCOMPLETE)
