"""Reports from one run's JSON: the goals, the summary table, every figure, and a plot.

``python -m bench.report bench/results/<date>.json`` rewrites ``<date>.md`` and
``<date>.png`` next to it from the stored measurements (nothing is run).

Every ratio is taken between figures of the same run: medians of the repetitions that
alternated between libraries in one process (*warm*: page cache and process warm), or
single calls in fresh processes after the page cache was dropped (*cold*).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from bench.goals import DEFAULT, GOALS, INPLACE, RAW_LOADS, STAGED, Goal, Ref

__all__ = ["render_markdown", "write_plot", "write_reports"]

MIB = 1 << 20


# --------------------------------------------------------------------------- figures


def _times(report: dict, ref: Ref, way: str) -> list[float] | None:
    group = report["groups"].get(ref.group)
    if not group or "error" in group:
        return None
    if ref.kind == "optimizer":
        group = group.get("optimizer", {})
    return group.get("times", {}).get(ref.op, {}).get(way)


def _probe(report: dict, ref: Ref, way: str) -> dict | None:
    """The way's fresh-process probe: with several rounds, one carrying the medians of their
    seconds and peak growths, and ``spread`` (their min and max seconds)."""
    found = [
        p
        for p in report.get("probes", [])
        if (p.get("group"), p.get("kind"), p.get("op"), p.get("way"))
        == (ref.group, ref.kind, ref.op, way)
        and "error" not in p
    ]
    if len(found) < 2:
        return found[0] if found else None
    seconds = [p["seconds"] for p in found]
    return {
        **found[0],
        "seconds": statistics.median(seconds),
        "peak_growth": statistics.median(p["peak_growth"] for p in found),
        "spread": (min(seconds), max(seconds)),
    }


def figure(report: dict, ref: Ref, way: str, cache: str) -> float | None:
    """One way's figure for ``ref`` in ``report`` (warm median or cold probe)."""
    if ref.stat in ("size", "read"):  # bytes, measured once by the group (MiB)
        group = report["groups"].get(ref.group) or {}
        value = group.get("file_bytes" if ref.stat == "size" else "bytes_read", {}).get(way)
        return None if value is None else value / MIB
    if ref.stat == "cpu_per_tensor":
        group = report["groups"].get(ref.group) or {}
        per_op = (group.get("optimizer", {}) if ref.kind == "optimizer" else group).get("cpu")
        cpu = (per_op or {}).get(ref.op, {}).get(way)
        if cache != "warm" or not cpu:
            return None
        return statistics.median(cpu) / group["tensor_count"] * 1e6
    if ref.stat == "memory":
        p = _probe(report, ref, way)
        return None if p is None else p["peak_growth"] / MIB
    if cache == "cold":
        p = _probe(report, ref, way)
        if p is None or p["cache"] != "cold":
            return None
        seconds = p["seconds"]
    else:
        times = _times(report, ref, way)
        if not times:
            return None
        seconds = statistics.median(times)
    if ref.stat == "per_tensor":
        return seconds / report["groups"][ref.group]["tensor_count"] * 1e6
    return seconds


def _measure(report: dict, goal: Goal, cache: str) -> tuple[float | None, str]:
    """The goal's value in one cache state, and how it reads."""
    if cache not in goal.caches:
        return None, ""
    a = goal.numerator.value(report, cache)
    if a is None:
        return None, ""
    if goal.denominator is None:
        unit = {
            "per_tensor": " µs",
            "cpu_per_tensor": " µs",
            "memory": " MiB",
            "time": " s",
            "read": " MiB",
        }[goal.numerator.stat]
        return a, f"{a:.2f}{unit}"
    b = goal.denominator.value(report, cache)
    if b is None or b <= 0:
        return None, ""
    return a / b, f"{a / b:.2f}x ({_secs(a)} / {_secs(b)})"


def _verdict(goal: Goal, values: list[float]) -> str:
    if goal.bound is None or not values:
        return "—"
    ok = all(v < goal.bound if goal.strict else v <= goal.bound for v in values)
    return "**met**" if ok else "**MISSED**"


def _secs(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def _bound(goal: Goal) -> str:
    if goal.bound is None:
        return ""
    unit = "x" if goal.denominator is not None else ""
    return f"{'<' if goal.strict else '≤'} {goal.bound:.3g}{unit}"


# --------------------------------------------------------------------------- markdown

_SUMMARY = [  # the table: (row, group, op, {column: ways})
    (
        "512 MiB save (durable, fsync)",
        "big1",
        "save",
        {
            "tlckpt": ("tlckpt",),
            "safetensors": ("safetensors",),
            "torch": ("torch",),
            "raw limit": ("raw write",),
        },
    ),
    (
        "512 MiB load into live tensors",
        "big1",
        "load",
        {
            "tlckpt": (DEFAULT, INPLACE, STAGED),
            "safetensors": ("safetensors",),
            "torch": ("torch",),
            "raw limit": RAW_LOADS,
        },
    ),
    (
        "20,000 x 64 float32, save",
        "small",
        "save",
        {
            "tlckpt": ("tlckpt",),
            "safetensors": ("safetensors",),
            "torch": ("torch",),
            "raw limit": ("raw write",),
        },
    ),
    (
        "20,000 x 64 float32, load",
        "small",
        "load",
        {
            "tlckpt": (DEFAULT, INPLACE, STAGED),
            "safetensors": ("safetensors",),
            "torch": ("torch",),
            "raw limit": ("raw readinto",),
        },
    ),
    (
        "GPT-2 small state, load",
        "gpt2",
        "load",
        {
            "tlckpt": (DEFAULT, INPLACE, STAGED),
            "safetensors": ("safetensors",),
            "torch": ("torch",),
            "raw limit": ("raw readinto", "raw preadv x2"),
        },
    ),
]


def _cell(report: dict, group: str, op: str, ways: tuple[str, ...]) -> str:
    parts = []
    per_tensor = group == "small"
    for way in ways:
        times = _times(report, Ref(group, op, ()), way)
        if not times:
            continue
        m = statistics.median(times)
        label = f" ({way.replace('tlckpt ', '').replace('raw ', '')})" if len(ways) > 1 else ""
        if per_tensor:
            n = report["groups"][group]["tensor_count"]
            lo, hi = min(times) / n * 1e6, max(times) / n * 1e6
            parts.append(f"{m / n * 1e6:.2f} µs/tensor [{lo:.2f}-{hi:.2f}]{label}")
        else:
            parts.append(f"{_secs(m)} [{_secs(min(times))}-{_secs(max(times))}]{label}")
    return "; ".join(parts) or "-"


def _summary(report: dict) -> list[str]:
    out = [
        "| workload | tlckpt | safetensors | torch | raw limit |",
        "|---|---|---|---|---|",
    ]
    for row, group, op, columns in _SUMMARY:
        cells = [
            _cell(report, group, op, columns[c])
            for c in ("tlckpt", "safetensors", "torch", "raw limit")
        ]
        out.append(f"| {row} | " + " | ".join(cells) + " |")
    for label in ("alike", "varied"):
        cell = _cell(report, "inspect", "inspect", (label,))
        out.append(f"| `inspect` of 10⁶ empty records ({label}) | {cell} | - | - | - |")
    return out


def _group_tables(report: dict) -> list[str]:
    out = []
    for name, group in report["groups"].items():
        if "error" in group:
            out += [f"### {name}: {group['error']}", ""]
            continue
        sections = [("state", group)]
        if "optimizer" in group:
            sections.append(("optimizer", group["optimizer"]))
        for kind, data in sections:
            size = data.get("payload_bytes", 0)
            if "params_bytes" in data:  # the sharded group: its ranks' figures
                title = (
                    f"### {name}: {data['params_bytes'] / MIB:.0f} MiB of float32 parameters"
                    f" + AdamW ({size / MIB:.0f} MiB of files), worlds"
                    f" {', '.join(map(str, data['worlds']))}: the slowest rank's time, rank 0's"
                    " peak growth"
                )
            else:
                title = (
                    f"### {name} ({kind}): {data.get('tensor_count', '')} tensors,"
                    f" {size / MIB:.1f} MiB"
                )
            out += [
                title,
                "",
                "| operation | way | median | min - max | GB/s | verified | cold (fresh process)"
                " | peak RSS growth MiB |",
                "|---|---|---:|---:|---:|---|---:|---:|",
            ]
            for op, ways in data["times"].items():
                for way, times in ways.items():
                    ref = Ref(name, op, (way,), kind)
                    probe = _probe(report, ref, way)
                    cold = _secs(probe["seconds"]) if probe and probe["cache"] == "cold" else ""
                    if cold and "spread" in probe:  # type: ignore[operator]
                        low, high = probe["spread"]  # type: ignore[index]
                        cold += f" [{_secs(low)}-{_secs(high)}]"
                    grow = f"{probe['peak_growth'] / MIB:+.1f}" if probe else ""
                    if not probe and way in data.get("growth", {}).get(op, {}):
                        grow = f"{data['growth'][op][way] / MIB:+.1f}"
                    m = statistics.median(times)
                    rate = f"{size / m / 1e9:.2f}" if size else ""
                    ok = data.get("verified", {}).get(way)
                    out.append(
                        f"| {op} | {way} | {_secs(m)} | {_secs(min(times))} - {_secs(max(times))}"
                        f" | {rate} | {'yes' if ok else ('NO' if ok is False else '')}"
                        f" | {cold} | {grow} |"
                    )
            out.append("")
    return out


def render_markdown(report: dict, png_name: str) -> str:
    """The whole report as Markdown."""
    meta, m = report["meta"], report["meta"]["machine"]
    v = m["versions"]
    methods = sorted({p["cache_method"] for p in report.get("probes", []) if "cache_method" in p})
    loads = "; ".join(", ".join(f"{x:.2f}" for x in triple) for triple in meta["loadavg"])
    out = [
        f"# tlckpt benchmark — {meta['started'][:10]} ({meta['mode']})",
        "",
        f"* Command: `{meta['command']}` (repository root, `.venv/bin/python`); wall time"
        f" {meta['wall_s']:.0f} s.",
        f"* Machine: {m['cpu']}, {m['cpus']} CPUs, {(m['mem_bytes'] or 0) / 2**30:.0f} GiB;"
        f" {m['platform']}; transparent huge pages: {m['thp']}.",
        f"* Python {m['python']}, torch {v['torch']} ({v['torch_threads']} threads), numpy"
        f" {v['numpy']}, safetensors {v['safetensors']}, orjson {v['orjson']}, transformers"
        f" {v['transformers']}; tlckpt at {(m['git_commit'] or 'unknown')[:12]}"
        f"{' + uncommitted changes' if m['git_dirty'] else ''}.",
        f"* Load average (1, 5, 15 min) at the start and after each group: {loads}.",
        "",
        "Method: each workload runs in a process of its own, with no environment variable"
        " set (the allocator as users have it). Every way of doing an operation is timed in"
        " turns with the others (one untimed round first), each call preceded by its untimed"
        " preparation (saves: the file is removed), `os.sync()` and `gc.collect()`: *warm*"
        " figures are medians [min-max] of those. *Cold* figures are one call in a fresh"
        " process after the page cache was dropped, repeated in"
        f" {report['meta'].get('cold_rounds', 1)} round(s) (every way once per round; the"
        " median [min-max] of the rounds)"
        f" ({' and '.join(methods) or 'no probe ran'}: `drop_caches` is the whole cache,"
        " `fadvise` only the files). Peak RSS growth: VmHWM (reset through"
        " `/proc/self/clear_refs`) minus VmRSS before the call, in those fresh processes."
        " After the timings every load way is checked to land the saved values.",
        "",
    ]
    if "sharded" in report["groups"]:
        out += [
            "The `sharded` group (FSDP2 model + AdamW against `torch.distributed.checkpoint`):"
            " each world's ranks are processes of their own (gloo on this machine, one thread"
            " each), started by the group's process; the ways take turns in the same process"
            " group (one untimed round first), `os.sync()` and a barrier before each call, a"
            " barrier after it: the time is the slowest rank's. Memory is rank 0's peak growth"
            " during the call; no cold figure (no goal asks for one).",
            "",
        ]
    out += [
        "## Goals",
        "",
        "| goal | warm | cold | bound | verdict |",
        "|---|---|---|---|---|",
    ]
    for goal in GOALS:
        warm, warm_text = _measure(report, goal, "warm")
        cold, cold_text = _measure(report, goal, "cold")
        values = [x for x in (warm, cold) if x is not None]
        out.append(
            f"| {goal.text} | {warm_text} | {cold_text} | {_bound(goal)}"
            f" | {_verdict(goal, values)} |"
        )
    out += ["", "## Summary (warm medians [min-max])", "", *_summary(report), ""]
    out += ["## Results", "", *_group_tables(report), f"![warm medians]({png_name})", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- plot


def write_plot(report: dict, png_path: Path) -> None:
    """Warm medians of every way, one panel per workload and operation (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for name, group in report["groups"].items():
        if "error" in group:
            continue
        for kind, data in [("state", group), ("optimizer", group.get("optimizer"))]:
            if data:
                panels += [(f"{name} {kind} {op}", ways) for op, ways in data["times"].items()]
    cols = 4
    rows = max(1, -(-len(panels) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (title, ways) in zip(axes.flat, panels):
        names = list(ways)
        medians = [statistics.median(ways[n]) for n in names]
        colors = ["tab:blue" if n.startswith("tlckpt") else "tab:gray" for n in names]
        ax.barh(range(len(names)), medians, color=colors)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("seconds (warm median)", fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(f"tlckpt benchmark {report['meta']['started'][:10]} — lower is better")
    fig.tight_layout()
    fig.savefig(png_path, dpi=90)
    plt.close(fig)


def write_reports(report: dict, stem: Path) -> tuple[Path, Path]:
    """Write ``<stem>.md`` and ``<stem>.png``; return their paths."""
    md_path, png_path = stem.with_suffix(".md"), stem.with_suffix(".png")
    write_plot(report, png_path)
    md_path.write_text(render_markdown(report, png_path.name), encoding="utf-8")
    return md_path, png_path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.report bench/results/<date>.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    report = json.loads(path.read_text(encoding="utf-8"))
    md_path, png_path = write_reports(report, path.with_suffix(""))
    print(f"wrote {md_path}, {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
