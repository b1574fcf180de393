#!/usr/bin/env python3
"""Tables and plots of the benchmarks' figures, from benchmarks/results.json.

    python3 scripts/bench-report.py           # rewrites the generated parts of docs/benchmarks.md
                                              # and the SVG plots in docs/benchmarks/
    python3 scripts/bench-report.py --check   # exits 1 when a committed file differs from what it
                                              # would write (CI), 0 when all are current

Writes, from the results file only (the same JSON gives byte-identical files):
- in docs/benchmarks.md, between `<!-- results:begin -->` and `<!-- results:end -->`, a table of each
  benchmark's latest run; between `<!-- sizing:begin -->` and `<!-- sizing:end -->`, the sizing table;
- docs/benchmarks/latency.svg: latency percentiles of each phase against their same-run baselines;
- docs/benchmarks/rss-by-services.svg: vipwatch's peak RSS against the number of Services;
- docs/benchmarks/haproxy-chain.svg: the HAProxy chain, from a Service's create to its VIP live.

Needs Python 3.11 and matplotlib as pinned in docs/requirements.txt (the SVGs' glyph outlines come
from matplotlib's own DejaVu Sans, so another matplotlib version may draw other bytes).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results.json"
PAGE = ROOT / "docs" / "benchmarks.md"
PLOTS = ROOT / "docs" / "benchmarks"
SCHEMA = 1

# The page's order; entries of other names follow in name order.
ORDER = ["ingest", "relay", "api", "backends", "haproxy", "burst", "burst-sizes", "burst-slow-apiserver", "templates",
         "store_backends", "failover"]

# How each entry is run: the bench and, for a mode of it, the argument that selects it.
COMMANDS = {"burst-sizes": ("burst", "--sizes"), "burst-slow-apiserver": ("burst", None)}

# Latency phases of the latency plot: (entry, label, figure name prefix); the figures are
# `<prefix> p50` and `<prefix> p99`, each with its baseline.
LATENCY_PHASES = [
    ("relay", "relay: steady, write → delivered", "steady: latency"),
    ("burst", "burst: burst, write → delivered", "burst: latency"),
    ("burst", "burst: steady, write → delivered", "steady: latency"),
    ("backends", "backends: endpoint change → delivered", "endpoint change → delivery"),
    ("haproxy", "haproxy: create → live", "create → live"),
    ("haproxy", "haproxy: member change → live", "member change → live"),
    ("store_backends", "store_backends: steady on PostgreSQL", "PostgreSQL: steady: latency"),
    ("api", "api: GET /api/v1/vips?limit=1000", "GET /api/v1/vips?limit=1000: latency"),
]

SIZE_NAME = re.compile(r"^(\d+) Services: (.*)$")


# ---------------------------------------------------------------- numbers


def fmt(v: float | None) -> str:
    """A value as the tables show it: about three significant digits, thousands separated."""
    if v is None:
        return "–"
    a = abs(v)
    if a >= 1000 or (a >= 10 and v == round(v)):
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a == 0:
        return "0"
    return f"{v:.3g}"


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return "–"
    a = abs(r)
    if a >= 100:
        return f"{r:,.0f}"
    if a >= 10:
        return f"{r:.1f}"
    return f"{r:.2f}" if a >= 0.1 else f"{r:.3g}"


def with_unit(v: float | None, unit: str) -> str:
    if v is None:
        return "–"
    return f"{fmt(v)} {unit}" if unit else fmt(v)


def escape(text: str) -> str:
    """Text for a Markdown table cell."""
    return text.replace("|", "\\|")


# ---------------------------------------------------------------- the results file


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        sys.exit(f"{path}: missing (run a benchmark: cargo bench --bench ingest)")
    if data.get("schema") != SCHEMA:
        sys.exit(f"{path}: schema {data.get('schema')!r}, this script reads {SCHEMA}")
    return data["benchmarks"]


def ordered(benchmarks: dict) -> list[str]:
    known = [k for k in ORDER if k in benchmarks]
    return known + sorted(k for k in benchmarks if k not in ORDER)


def figures(entry: dict) -> dict[str, dict]:
    return {f["name"]: f for f in entry["figures"]}


def command(key: str, entry: dict) -> str:
    bench, mode = COMMANDS.get(key, (key, None))
    args = list(entry.get("args", []))
    if mode and not any(a.startswith(mode) for a in args):
        args.insert(0, mode)
    return f"cargo bench --bench {bench}" + (" -- " + " ".join(args) if args else "")


def run_line(entry: dict) -> str:
    m = entry.get("machine", {})
    commit = entry.get("commit") or {}
    commit_text = f"commit `{commit.get('id', '?')}`" + (" (the code measured may differ)" if commit.get("dirty") else "")
    if commit.get("built"):
        commit_text += f", built {commit['built']}"
    load_1m = m.get("load_1m") or {}
    env = entry.get("environment") or {}
    parts = [
        entry.get("date", "?"),
        commit_text,
        f"{m.get('cpu') or 'unknown CPU'}, {m.get('cores', '?')} cores, {fmt(m.get('memory_gib'))} GiB",
        f"load {fmt(load_1m.get('start'))} → {fmt(load_1m.get('end'))}",
        f"{fmt(entry.get('duration_s'))} s",
    ]
    if env:
        parts.append("environment " + ", ".join(f"`{k}={v}`" for k, v in sorted(env.items())))
    return " · ".join(parts)


# ---------------------------------------------------------------- tables


def table(key: str, entry: dict) -> list[str]:
    lines = [f"### Figures: {key}", "", f"`{command(key, entry)}`", "", run_line(entry), ""]
    if key == "burst-sizes":
        return lines + sizes_table(entry)
    lines += ["| figure | value | baseline (same run) | baseline value | ratio |", "|---|---:|---|---:|---:|"]
    for f in entry["figures"]:
        b = f.get("baseline")
        lines.append(
            f"| {escape(f['name'])} | {with_unit(f['value'], f['unit'])} | "
            f"{escape(b['name']) if b else '–'} | {with_unit(b['value'], f['unit']) if b else '–'} | "
            f"{fmt_ratio(f.get('ratio'))} |"
        )
    return lines + [""]


def by_size(entry: dict) -> tuple[list[int], dict[str, dict[int, dict]], list[dict]]:
    """The sizing run's figures: sizes, {figure name without the size: {size: figure}}, the others."""
    rows: dict[str, dict[int, dict]] = {}
    other = []
    for f in entry["figures"]:
        m = SIZE_NAME.match(f["name"])
        if m:
            rows.setdefault(m.group(2), {})[int(m.group(1))] = f
        else:
            other.append(f)
    sizes = sorted({n for r in rows.values() for n in r})
    return sizes, rows, other


def sizes_table(entry: dict) -> list[str]:
    sizes, rows, other = by_size(entry)
    head = "| figure | " + " | ".join(f"{n:,} Services" for n in sizes) + " | baseline (same run) |"
    lines = []
    if other:
        lines += ["; ".join(f"{f['name']}: {with_unit(f['value'], f['unit'])}" for f in other) + ".", ""]
    lines += [
        "Each cell: the value, then its ratio to the baseline of the same size's run.",
        "",
        head,
        "|---|" + "---:|" * len(sizes) + "---|",
    ]
    for name, cells in rows.items():
        any_f = next(iter(cells.values()))
        b = any_f.get("baseline")
        out = []
        for n in sizes:
            f = cells.get(n)
            if f is None:
                out.append("–")
                continue
            cell = with_unit(f["value"], f["unit"])
            if f.get("ratio") is not None:
                cell += f" (×{fmt_ratio(f['ratio'])})"
            out.append(cell)
        lines.append(f"| {escape(name)} | " + " | ".join(out) + f" | {escape(b['name']) if b else '–'} |")
    return lines + [""]


def results_block(benchmarks: dict) -> str:
    lines = [
        "<!-- Generated by scripts/bench-report.py from benchmarks/results.json: do not edit by hand. -->",
        "",
    ]
    for key in ordered(benchmarks):
        lines += table(key, benchmarks[key])
    return "\n".join(lines).rstrip("\n") + "\n"


def value(entry: dict | None, name: str) -> float | None:
    if not entry:
        return None
    f = figures(entry).get(name)
    return f["value"] if f else None


def sizing_block(benchmarks: dict) -> str:
    lines = [
        "<!-- Generated by scripts/bench-report.py from benchmarks/results.json: do not edit by hand. -->",
        "",
    ]
    sizes_entry = benchmarks.get("burst-sizes")
    if sizes_entry:
        sizes, rows, _ = by_size(sizes_entry)
        rate = sizes_entry["parameters"].get("rate")

        def cell(name: str, n: int) -> dict | None:
            return rows.get(name, {}).get(n)

        lines += [
            f"From `{command('burst-sizes', sizes_entry)}` ({sizes_entry.get('date', '?')}): `vipwatch serve` with SQLite, "
            "the default config and one webhook endpoint, Services without members.",
            "",
            f"| cluster | peak RSS: initial sync | peak RSS: {rate} changes/s | initial sync: all delivered | "
            f"CPU: initial sync | CPU per change at {rate}/s |",
            "|---|---:|---:|---:|---:|---:|",
            f"| empty | {with_unit(value(sizes_entry, 'empty cluster: peak RSS'), 'MiB')} | | | | idle |",
        ]
        for n in sizes:
            cpu = cell("steady: vipwatch CPU per change", n)
            cpu_text = "–"
            if cpu:
                cpu_text = f"{with_unit(cpu['value'], 'ms')} ({fmt_ratio(cpu.get('ratio'))} cores)"
            sync, steady = cell("initial sync: peak RSS", n), cell("steady: peak RSS", n)
            delivered, sync_cpu = cell("initial sync: all delivered", n), cell("initial sync: vipwatch CPU", n)
            lines.append(
                f"| {n:,} Services | {with_unit(sync and sync['value'], 'MiB')} | "
                f"{with_unit(steady and steady['value'], 'MiB')} | {with_unit(delivered and delivered['value'], 's')} | "
                f"{with_unit(sync_cpu and sync_cpu['value'], 's')} | {cpu_text} |"
            )
        lines.append("")
        first, last = (cell("initial sync: peak RSS", sizes[0]), cell("initial sync: peak RSS", sizes[-1])) if sizes else (None, None)
        if first and last and sizes[-1] > sizes[0]:
            per = (last["value"] - first["value"]) * 1024 / (sizes[-1] - sizes[0])
            lines += [
                f"Between {sizes[0]:,} and {sizes[-1]:,} Services the initial sync's peak grows by about "
                f"{fmt(per)} KiB per Service, on top of the empty process.",
                "",
            ]
    other = []
    backends = benchmarks.get("backends")
    if backends:
        p = backends["parameters"]
        other.append(
            f"| {p.get('services', 0):,} Services × {p.get('endpoints')} endpoints, {p.get('nodes')} Nodes "
            f"(`[backends] mode = \"pod\"`; `backends`) | "
            f"{with_unit(value(backends, 'initial sync: peak RSS'), 'MiB')} after the initial sync, "
            f"{with_unit(value(backends, 'churn: peak RSS'), 'MiB')} after {p.get('rate')} EndpointSlice changes/s | "
            f"mode none {with_unit(figure_baseline(backends, 'initial sync: peak RSS'), 'MiB')} |"
        )
    burst = benchmarks.get("burst")
    if burst and burst["parameters"].get("pool"):
        other.append(
            f"| {burst['parameters'].get('services', 0):,} Services with a pool (`BENCH_POOL=1`; `burst`) | "
            f"{with_unit(value(burst, 'initial sync: peak RSS'), 'MiB')} after the initial sync | "
            f"{with_unit(value(burst, 'empty cluster: peak RSS'), 'MiB')} |"
        )
    stores = benchmarks.get("store_backends")
    if stores:
        p = stores["parameters"]
        other.append(
            f"| {p.get('services', 0):,} Services on PostgreSQL (`store_backends`) | "
            f"{with_unit(value(stores, 'PostgreSQL: peak RSS'), 'MiB')} | "
            f"{with_unit(figure_baseline(stores, 'PostgreSQL: peak RSS'), 'MiB')} on SQLite |"
        )
        other.append(
            f"| {p.get('takeover_services', 0):,} Services, two replicas on PostgreSQL (`store_backends`) | "
            f"leader {with_unit(value(stores, 'takeover: peak RSS of the leader'), 'MiB')}, "
            f"follower {with_unit(value(stores, 'takeover: peak RSS of the follower'), 'MiB')} | – |"
        )
    haproxy = benchmarks.get("haproxy")
    if haproxy:
        p = haproxy["parameters"]
        other.append(
            f"| the HAProxy agent and HAProxy for {p.get('bulk', 0):,} Services (`haproxy`) | "
            f"agent {with_unit(value(haproxy, 'bulk: peak RSS of the agent'), 'MiB')}, "
            f"HAProxy worker {with_unit(value(haproxy, 'bulk: peak RSS of HAProxy' + chr(39) + 's worker'), 'MiB')}, "
            f"master {with_unit(value(haproxy, 'bulk: peak RSS of HAProxy' + chr(39) + 's master'), 'MiB')} | "
            f"vipwatch {with_unit(value(haproxy, 'bulk: peak RSS of vipwatch'), 'MiB')} |"
        )
    if other:
        lines += ["| other configurations | peak RSS | compared with (same run) |", "|---|---|---|", *other, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def figure_baseline(entry: dict, name: str) -> float | None:
    f = figures(entry).get(name)
    return f["baseline"]["value"] if f and f.get("baseline") else None


def replace_block(page: str, marker: str, block: str) -> str:
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
        sys.exit(f"{PAGE}: needs exactly one `{begin}` before one `{end}`")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}{end}{tail}"


# ---------------------------------------------------------------- plots

VIPWATCH = "#1f6fb2"
BASELINE = "#a0a0a0"
EXTRA = "#e07b28"


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update(
        {
            "svg.hashsalt": "vipwatch-benchmarks",
            "svg.fonttype": "path",
            "font.family": "DejaVu Sans",
            "font.size": 9,
            "axes.titlesize": 10,
            "figure.dpi": 100,
            "savefig.dpi": 100,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    import matplotlib.pyplot as plt

    return plt


def svg(plt, fig) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return out.getvalue()


def empty_plot(plt, text: str) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 1))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center")
    return svg(plt, fig)


def latency_plot(plt, benchmarks: dict) -> bytes:
    rows = []  # (label, value, baseline value, baseline name, ratio)
    for key, label, prefix in LATENCY_PHASES:
        entry = benchmarks.get(key)
        if not entry:
            continue
        fs = figures(entry)
        for q in ("p50", "p99"):
            f = fs.get(f"{prefix} {q}")
            if f and f.get("baseline") and f["value"] and f["baseline"]["value"] is not None:
                rows.append((f"{label} {q}", f["value"], f["baseline"]["value"], f["baseline"]["name"], f.get("ratio")))
    if not rows:
        return empty_plot(plt, "no latency figures in benchmarks/results.json")
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(rows) + 1.2))
    ys = list(range(len(rows)))[::-1]
    h = 0.38
    ax.barh([y + h / 2 for y in ys], [r[1] for r in rows], height=h, color=VIPWATCH, label="vipwatch")
    # A baseline of 0 (the bare watch saw the change before the writer had the apiserver's answer)
    # has no bar on a log scale: its label sits at the axis' left end.
    lo = min(v for r in rows for v in (r[1], r[2]) if v > 0)
    hi = max(max(r[1], r[2]) for r in rows)
    left = lo / 2
    ax.barh([y - h / 2 for y in ys], [r[2] if r[2] > 0 else 0 for r in rows], height=h, color=BASELINE,
            label="baseline of the same run")
    for y, r in zip(ys, rows):
        ratio = f" (×{fmt_ratio(r[4])})" if r[4] is not None else ""
        ax.text(r[1] * 1.08, y + h / 2, f"{fmt(r[1])} ms{ratio}", va="center", fontsize=7.5)
        ax.text(max(r[2], left) * 1.08, y - h / 2, f"{fmt(r[2])} ms: {r[3]}", va="center", fontsize=7, color="#505050")
    ax.set_yticks(ys, [r[0] for r in rows])
    ax.set_xscale("log")
    ax.set_xlim(left, hi * 30)
    ax.set_xlabel("milliseconds (log scale)")
    ax.set_title("Latency by phase, next to the baseline measured in the same run")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False, fontsize=8)
    fig.tight_layout()
    return svg(plt, fig)


def rss_plot(plt, benchmarks: dict) -> bytes:
    entry = benchmarks.get("burst-sizes")
    if not entry:
        return empty_plot(plt, "no burst-sizes run in benchmarks/results.json (cargo bench --bench burst -- --sizes)")
    sizes, rows, _ = by_size(entry)
    rate = entry["parameters"].get("rate")
    fig, ax = plt.subplots(figsize=(7, 4))
    series = [
        ("initial sync: peak RSS", "peak RSS, initial sync", "o", VIPWATCH),
        ("steady: peak RSS", f"peak RSS, {rate} changes/s", "s", EXTRA),
        ("initial sync: anonymous RSS at its end", "anonymous RSS after the initial sync", "^", "#3a9a5b"),
    ]
    for name, label, marker, color in series:
        pts = [(n, rows[name][n]["value"]) for n in sizes if name in rows and n in rows[name] and rows[name][n]["value"] is not None]
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=label)
        if name == "initial sync: peak RSS":
            for i, (n, v) in enumerate(pts):
                last = i == len(pts) - 1
                ax.annotate(f"{fmt(v)} MiB", (n, v), textcoords="offset points", xytext=(-8 if last else 8, -3),
                            ha="right" if last else "left", va="top", fontsize=7.5)
    empty = value(entry, "empty cluster: peak RSS")
    if empty is not None:
        ax.axhline(empty, color=BASELINE, linestyle="--", linewidth=1)
        ax.annotate(f"empty cluster (baseline): {fmt(empty)} MiB", (sizes[-1], empty), textcoords="offset points",
                    xytext=(0, 3), ha="right", va="bottom", fontsize=7.5, color="#505050")
    backends = benchmarks.get("backends")
    if backends and value(backends, "initial sync: peak RSS") is not None:
        p = backends["parameters"]
        ax.plot([p["services"]], [value(backends, "initial sync: peak RSS")], marker="D", linestyle="none", color="#8a3ab9",
                label=f"with {p['endpoints']} endpoints each (backends bench, initial sync)")
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
    ax.minorticks_off()
    top = max([v["value"] for r in rows.values() for v in r.values() if v["unit"] == "MiB" and v["value"]] + [empty or 0])
    ax.set_ylim(0, top * 1.15)
    ax.set_xlabel("Services in the cluster (log scale)")
    ax.set_ylabel("MiB")
    ax.set_title("vipwatch's peak RSS by number of Services")
    ax.legend(loc="upper left", frameon=False, fontsize=8)
    fig.tight_layout()
    return svg(plt, fig)


def haproxy_plot(plt, benchmarks: dict) -> bytes:
    entry = benchmarks.get("haproxy")
    if not entry:
        return empty_plot(plt, "no haproxy run in benchmarks/results.json")
    fs = figures(entry)
    rows = []  # (label, delivered, live)
    for prefix, label in (("create → live", "Service created"), ("member change → live", "member change")):
        for q in ("p50", "p99"):
            f = fs.get(f"{prefix} {q}")
            if f and f.get("baseline"):
                rows.append((f"{label} {q}", f["baseline"]["value"], f["value"]))
    bulk = fs.get("bulk: all live")
    fig, axes = plt.subplots(2, 1, figsize=(8, 4.6), gridspec_kw={"height_ratios": [max(len(rows), 1), 1.3]})
    ax = axes[0]
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [r[1] for r in rows], color=VIPWATCH, label="vipwatch: until delivered to the receiver")
    ax.barh(ys, [max(r[2] - r[1], 0) for r in rows], left=[r[1] for r in rows], color=EXTRA,
            label="then the agent and HAProxy: until a connection through the VIP reaches the pod")
    for y, r in zip(ys, rows):
        ax.text(max(r[1], r[2]) + 8, y, f"live {fmt(r[2])} ms (delivered {fmt(r[1])} ms)", va="center", fontsize=7.5)
    ax.set_yticks(ys, [r[0] for r in rows])
    ax.set_xlim(0, max([max(r[1], r[2]) for r in rows] + [1]) * 1.55)
    ax.set_xlabel("milliseconds from the write to the apiserver")
    p = entry["parameters"]
    ax.set_title(f"HAProxy chain: apiserver → vipwatch → agent → HAProxy, {p.get('creates')} Services one by one")
    ax = axes[1]
    if bulk and bulk.get("baseline"):
        d, live = bulk["baseline"]["value"], bulk["value"]
        reloads = fs.get("bulk: reloads")
        ax.barh([0], [d], color=VIPWATCH)
        ax.barh([0], [max(live - d, 0)], left=[d], color=EXTRA)
        text = f"all live {fmt(live)} s (delivered {fmt(d)} s)"
        if reloads:
            text += f", {fmt(reloads['value'])} reloads"
        ax.text(max(d, live) * 1.02, 0, text, va="center", fontsize=7.5)
        ax.set_yticks([0], [f"{p.get('bulk', 0):,} Services from empty"])
        ax.set_xlim(0, max(d, live) * 1.6)
        ax.set_xlabel("seconds from vipwatch's start")
    else:
        ax.axis("off")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=1, frameon=False, fontsize=7.5)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return svg(plt, fig)


# ---------------------------------------------------------------- main


def outputs(benchmarks: dict) -> dict[Path, bytes]:
    try:
        page = PAGE.read_text(encoding="utf-8")
    except FileNotFoundError:
        sys.exit(f"{PAGE}: missing (it holds the markers the tables go between)")
    page = replace_block(page, "results", results_block(benchmarks))
    page = replace_block(page, "sizing", sizing_block(benchmarks))
    plt = pyplot()
    return {
        PAGE: page.encode("utf-8"),
        PLOTS / "latency.svg": latency_plot(plt, benchmarks),
        PLOTS / "rss-by-services.svg": rss_plot(plt, benchmarks),
        PLOTS / "haproxy-chain.svg": haproxy_plot(plt, benchmarks),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a written file would change; write nothing")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results file (default: %(default)s)")
    args = parser.parse_args()
    files = outputs(load(args.results))
    stale = []
    for path, data in files.items():
        current = path.read_bytes() if path.exists() else None
        if current == data:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    rel = [str(p.relative_to(ROOT)) for p in stale]
    if args.check:
        if stale:
            print("not current (run python3 scripts/bench-report.py and commit):", *rel, sep="\n  ", file=sys.stderr)
            return 1
        print("docs/benchmarks.md and docs/benchmarks/*.svg are current")
        return 0
    print("wrote:", *rel, sep="\n  ") if rel else print("nothing to change")
    return 0


if __name__ == "__main__":
    sys.exit(main())
