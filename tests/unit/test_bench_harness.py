"""The benchmark harnesses' own logic, in seconds: how ``contend bench`` keeps other
benchmarks' sections of its page, the order the peers benchmark measures in, and the figures
the sustained-load run derives from its stamps. The benchmarks themselves run by ``make bench``."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from benchmarks.peers.report import against_targets
from benchmarks.peers.run import System, ratios, systems
from benchmarks.sustained.chart import by_hand
from benchmarks.sustained.driver import Plan, recovery, settled, summarise
from benchmarks.sustained.report import markdown as sustained_markdown

from contend.cli import bench

ROOT = Path(__file__).resolve().parents[2]


def test_put_section_appends_then_replaces_only_its_own_block() -> None:
    page = "# Benchmarks\n\ntext\n"
    page = bench.put_section(page, "peers", "first")
    page = bench.put_section(page, "sustained", "other")
    page = bench.put_section(page, "peers", "second\nline")
    assert page.count("<!-- begin peers -->") == 1
    assert "first" not in page and "second\nline" in page and "other" in page
    assert bench.marked_sections(page) == [
        "<!-- begin peers -->\nsecond\nline\n<!-- end peers -->",
        "<!-- begin sustained -->\nother\n<!-- end sustained -->",
    ]


def test_rewriting_the_bench_page_keeps_the_marked_sections(tmp_path: Path) -> None:
    md = tmp_path / "benchmarks.md"
    md.write_text(bench.put_section("# old page\n", "peers", "| peer table |"))
    results = {"drain_2p_per_s": 1000, "latency_p99_ms": 3.0, "submit_call_p50_ms": 0.5}
    bench._write(md, "sqlite", results, 100, 8, "sync")
    text = md.read_text()
    assert "# old page" not in text  # the page itself is rewritten…
    assert "| peer table |" in text  # …the section kept
    assert "| task body | sync |" in text and "one submit call of one task" in text


def test_rewriting_the_bench_page_keeps_what_was_written_by_hand(tmp_path: Path) -> None:
    # make bench rewrote the whole page but for the marked sections: the notes and the
    # same-run comparisons written by hand between them were lost on every run
    md = tmp_path / "benchmarks.md"
    results = {"drain_2p_per_s": 1000, "latency_p99_ms": 3.0, "submit_call_p50_ms": 0.5}
    bench._write(md, "sqlite", results, 100, 8, "sync")
    by_hand = "## Two versions side by side\n\nmeasured by hand\n"
    md.write_text(md.read_text() + "\n" + by_hand + "\n" + bench.put_section("", "peers", "| p |"))
    bench._write(md, "sqlite", {**results, "drain_2p_per_s": 2000}, 100, 8, "sync")
    text = md.read_text()
    assert by_hand in text and "| p |" in text
    assert text.count("<!-- begin bench -->") == 1
    assert "2,000" in text and "1,000" not in text


def test_a_bench_removes_its_temporary_folder_when_its_process_ends() -> None:
    # the benchmark harnesses that drive a Bench left its folder, and its SQLite files, behind
    code = (
        "import argparse; from contend.cli.bench import Bench; "
        "b = Bench(argparse.Namespace(quick=True, tasks=1, concurrency=1, store=None)); "
        "open(b.tmp + '/bench1.db', 'w').write('x'); print(b.tmp)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    folder = Path(done.stdout.strip())
    assert folder.name.startswith("contend-bench-")
    assert not folder.exists()


def test_peers_take_turns_with_contend_and_every_shape_is_measured() -> None:
    order = systems(["sqlite", "postgresql"], ["pgqueuer", "procrastinate", "huey-sqlite"])
    kinds = [s.kind for s in order]
    assert kinds[:5] == ["contend", "huey-sqlite", "contend", "contend", "contend"]
    assert kinds[5:9] == ["contend", "pgqueuer", "contend", "procrastinate"]
    shapes = {(s.backend, s.body, s.concurrency) for s in order if s.kind == "contend"}
    assert shapes == {
        (b, body, c)
        for b, tuned in (("sqlite", 32), ("postgresql", 64))
        for body in ("sync", "async")
        for c in (8, tuned)
    }


def test_ratios_compare_each_contend_shape_with_the_peers_of_its_backend() -> None:
    c = System("contend postgresql async 2×8", "contend", "postgresql")
    c.runs = [{"drain_per_s": 3000, "cpu_us": 100}, {"drain_per_s": 1000, "cpu_us": 300}]
    p = System("pgqueuer", "pgqueuer", "postgresql", runs=[{"drain_per_s": 1000, "cpu_us": 400}])
    h = System("huey-sqlite", "huey-sqlite", "sqlite", runs=[{"drain_per_s": 10, "cpu_us": 1}])
    (row,) = ratios([c, p, h])
    assert row["peer"] == "pgqueuer"
    assert row["drain_per_s"] == 2.0 and row["cpu_us"] == 0.5  # medians 2000 / 1000, 200 / 400
    assert row["latency_p99_ms"] is None  # no figure, no ratio


def test_the_default_shape_is_judged_against_the_targets_and_nothing_else() -> None:
    def row(kind: str, backend: str, shape: str, **median: float) -> dict[str, object]:
        return {"kind": kind, "backend": backend, "shape": shape, "median": median}

    summary = {
        "systems": [
            row("contend", "etcd", "sync body, 2 × 8 (default)", drain_per_s=9_000.0),
            row("contend", "etcd", "sync body, 2 × 512 (tuned)", drain_per_s=12_000.0),
            row("pgqueuer", "postgresql", "async body, 2 workers", latency_p99_ms=1.0),
            row("contend", "sqlite", "async body, 2 × 8 (default)", latency_p99_ms=4.99),
            row("contend", "postgresql", "sync body, 2 × 8 (default)", submit_call_p50_ms=1.6),
        ]
    }
    rows = [line for line in against_targets(summary) if line.startswith("| ")][1:]
    assert rows == [  # in the targets' order; the tuned shape and the peers are not judged
        "| etcd, sync, drain | ≥ 10,000 tasks/s | 9,000 | **no** |",
        "| sqlite, async, idle p99 | ≤ 5.0 ms | 4.99 | yes |",
        "| postgresql, sync, one submit call p50 | ≤ 1.5 ms | 1.60 | **no** |",
    ]
    assert against_targets({"systems": summary["systems"][1:3]}) == []  # tuned and peers only


def test_sustained_figures_per_window_and_recovery_after_the_hold() -> None:
    plan = Plan(rate=10, duration=40.0, hold=True)
    submits = [i / 10 for i in range(400)]

    # 1 ms pickup, 500 ms while held (10-20 s), 1 ms again from 23 s; the last task never starts
    def pickup(s: float) -> float:
        return 0.5 if 10 <= s < 23 else 0.001

    started = [(s, s + pickup(s)) for s in submits[:-1]]
    marks = {"hold_began": 10.0, "hold_ended": 20.0}
    out = summarise("x", plan, submits, started, [{"t": 0, "bytes": 1}], marks)
    assert [w["submitted"] for w in out["windows"]] == [100] * 4
    assert out["windows"][3]["not_started"] == 1 and out["done"] == 399
    assert out["windows"][0]["p99_ms"] == 1.0 and out["windows"][1]["p50_ms"] == 500.0
    assert out["recovery_s"] == 3.0
    # 2 s of warm-up, then 8 fast seconds before the hold; after it 3 slow ones (20-23 s) of 20
    assert out["slow_seconds"] == {"before": [0, 8], "after": [3, 20]}
    lat = [(s, (st - s) * 1000) for s, st in started]
    assert recovery([(s, 500.0 if s >= 10 else ms) for s, ms in lat], 10.0, 20.0, 40.0) is None
    assert out["settled_s"] == 3.0  # the first 10 s that are normal again begin at 23 s


def test_settled_is_the_first_normal_10_s_window_whatever_comes_later() -> None:
    """A slow second long after the hold moves ``recovery`` but not ``settled``; slow seconds
    inside the first 10 s after it do."""
    lat = [(i / 100, 1.0) for i in range(6000)]  # 60 s, 100 tasks a second at 1 ms

    def slow_at(*seconds: int) -> list[tuple[float, float]]:
        return [(s, 300.0 if int(s) in seconds else ms) for s, ms in lat]

    assert settled(slow_at(50), 10.0, 20.0, 60.0) == 0.0
    assert recovery(slow_at(50), 10.0, 20.0, 60.0) == 31.0
    assert settled(slow_at(20, 22), 10.0, 20.0, 60.0) == 3.0
    assert settled([(s, 300.0 if s >= 20 else ms) for s, ms in lat], 10.0, 20.0, 60.0) is None


def test_sustained_report_and_hand_drawn_chart(tmp_path: Path) -> None:
    plan = Plan(rate=10, duration=20.0)
    submits = [i / 10 for i in range(200)]
    run = summarise("contend sqlite async 2×8", plan, submits, [(s, s + 0.002) for s in submits],
                    [{"t": 0, "bytes": 2**20}, {"t": 20, "bytes": 3 * 2**20}], {})  # fmt: skip
    summary = {"measured_at": "now", "commit": "abc", "rate": 10.0, "duration_s": 20.0,
               "quick": True, "machine_json_per_s_before": 1, "machine_json_per_s_after": 2,
               "loadavg_before": 0.1, "loadavg_after": 0.2, "results": [run]}  # fmt: skip
    text = sustained_markdown(summary, "sustained.svg")
    assert "| 200 / 200 | 2.0 | 2.0 |" in text and "1.0 → 3.0 → 3.0" in text
    by_hand(summary, tmp_path / "c.svg")
    assert ET.parse(tmp_path / "c.svg").getroot().tag.endswith("svg")


def test_the_benchmark_commands_parse_their_options() -> None:
    for module in ("benchmarks.peers", "benchmarks.sustained", "benchmarks.shares"):
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert "--quick" in done.stdout


def test_a_merged_sustained_run_replaces_only_the_runs_made_again() -> None:
    from benchmarks.sustained.run import merged

    def run(case: str, hold: bool, p99: float) -> dict[str, object]:
        return {"case": case, "hold": hold, "p99_ms": p99}

    old = {
        "commit": "aaa",
        "measured_at": "then",
        "results": [run("contend-postgresql-async", False, 55.0), run("pgqueuer", True, 9e4)],
    }
    new = {
        "commit": "bbb",
        "measured_at": "now",
        "results": [run("contend-sqlite-async", True, 5.0)],
    }
    new["results"][0].update(commit="bbb", measured_at="now")
    again = {"commit": "ccc", "measured_at": "later", "results": [run("pgqueuer", True, 20.0)]}
    again["results"][0].update(commit="ccc", measured_at="later")
    got = merged(merged(old, new), again)
    assert [(r["case"], r["hold"], r["p99_ms"], r["commit"]) for r in got["results"]] == [
        ("contend-postgresql-async", False, 55.0, "aaa"),
        ("pgqueuer", True, 20.0, "ccc"),  # the run made again replaces the old one
        ("contend-sqlite-async", True, 5.0, "bbb"),
    ]
    assert got["commit"] == "ccc"


def test_the_shares_table_names_each_runs_smallest_and_largest_share() -> None:
    from benchmarks.shares import table

    runs = [{"shares": [0.4, 1.0, 1.1, 1.5]}, {"shares": [0.9, 1.0, 1.0, 1.1]}]
    text = table("sqlite", {"burst-20k-sync": runs})
    assert "| burst-20k-sync | 0.40 0.90 | 0.65 | 1.50 1.10 |" in text


def test_shares_merge_keeps_the_other_backends_with_their_dates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import benchmarks.shares as shares

    (tmp_path / "docs").mkdir()
    old_meta = {"date": "2026-12-01 10:00 UTC", "commit": "aaa", "machine": "m", "runs": 3}
    run = [{"shares": [0.9, 1.0, 1.0, 1.1]}]
    old = {"meta": old_meta, "results": {"sqlite": {"c": run}, "etcd": {"c": []}}}
    (tmp_path / "docs" / "shares.json").write_text(json.dumps(old))
    (tmp_path / "docs" / "benchmarks.md").write_text("# Benchmarks\n")
    monkeypatch.setattr(shares, "ROOT", tmp_path)
    now = {"date": "2026-12-04 20:00 UTC", "commit": "bbb", "machine": "m", "runs": 3}
    results, measured = shares.merged({"etcd": {"c": run}}, {"etcd": now})
    assert results == {"sqlite": {"c": run}, "etcd": {"c": run}}  # etcd's new figures
    assert measured["sqlite"]["commit"] == "aaa" and measured["etcd"]["commit"] == "bbb"
    shares.write(results, {**now, "measured": measured})
    text = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "sqlite: measured 2026-12-01 10:00 UTC at commit aaa." in text
    assert "etcd: measured" not in text  # measured at the commit the header names
