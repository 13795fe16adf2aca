"""``python -m benchmarks.sustained.chart RESULTS.json OUT.svg``: the sustained-load chart,
pickup latency p50 and p99 per 10-s window for every run, the held-back stretch shaded, and the
store's size beside it; windows some of whose tasks never started are shaded red. matplotlib where the bench virtualenv has it; otherwise a small SVG
written by hand (p99 lines only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2"]


def _label(r: dict[str, Any]) -> str:
    return f"{r['system']}{', held back' if r['hold'] else ''}"


def with_matplotlib(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: a smaller file
    import matplotlib.pyplot as plt

    results = data["results"]
    fig, axes = plt.subplots(len(results), 2, figsize=(11, 2.2 * len(results)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1]})  # fmt: skip
    for (lat, size), r, colour in zip(axes, results, COLOURS * 4, strict=False):
        xs = [w["t"] + 5 for w in r["windows"]]
        for key, style in (("p50_ms", "--"), ("p99_ms", "-")):
            ys = [w[key] if w[key] else float("nan") for w in r["windows"]]
            lat.plot(xs, ys, style, color=colour, label=key.split("_")[0])
        if "hold_began" in r and "hold_ended" in r:
            for ax in (lat, size):
                ax.axvspan(r["hold_began"], r["hold_ended"], color="0.85", zorder=0)
        for w in r["windows"]:  # windows some of whose tasks never started
            if w["not_started"]:
                lat.axvspan(w["t"], w["t"] + 10, color="#d62728", alpha=0.12, zorder=0, lw=0)
        lat.set_xlim(0, r["duration_s"])
        lat.set_yscale("log")
        lat.set_ylabel("ms")
        lat.set_title(_label(r) + f": {r['done']:,} of {r['submitted']:,} done", fontsize=9)
        lat.legend(fontsize=7, loc="upper left")
        size.plot([s["t"] for s in r["sizes"]], [s["bytes"] / 2**20 for s in r["sizes"]],
                  color=colour)  # fmt: skip
        size.set_ylabel("store MiB")
        size.set_title("store size", fontsize=9)
    axes[-1][0].set_xlabel("seconds since the producer started (by submit time)")
    axes[-1][1].set_xlabel("s")
    fig.suptitle(
        f"Pickup latency at {data['rate']:,.0f} tasks/s ({data['measured_at']}, {data['commit']};"
        " grey: cleanup held back; red: windows with tasks never started)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, format="svg")


def by_hand(data: dict[str, Any], out: Path) -> None:
    import math

    w, h, pad = 760, 360, 50
    results = data["results"]
    ys = [x["p99_ms"] for r in results for x in r["windows"] if x["p99_ms"]] or [1.0]
    lo, hi = math.log10(max(min(ys), 0.1)), math.log10(max(ys)) + 0.1
    span = max(r["duration_s"] for r in results)

    def pos(t: float, ms: float) -> str:
        x = pad + (w - 2 * pad) * t / span
        y = h - pad - (h - 2 * pad) * (math.log10(max(ms, 0.1)) - lo) / max(hi - lo, 1e-9)
        return f"{x:.1f},{y:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-size="11">',
             f'<text x="{pad}" y="20">p99 pickup latency per 10-s window (ms, log scale)</text>']  # fmt: skip
    for i, (r, colour) in enumerate(zip(results, COLOURS * 4, strict=False)):
        pts = " ".join(pos(x["t"] + 5, x["p99_ms"]) for x in r["windows"] if x["p99_ms"])
        parts.append(f'<polyline fill="none" stroke="{colour}" points="{pts}"/>')
        parts.append(
            f'<text x="{w - pad - 250}" y="{40 + 14 * i}" fill="{colour}">{_label(r)}</text>'
        )
    parts.append("</svg>")
    out.write_text("\n".join(parts) + "\n")


def main() -> int:
    data = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    try:
        with_matplotlib(data, out)
    except ImportError:
        by_hand(data, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
