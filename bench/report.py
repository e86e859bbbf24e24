"""Reports from one run's JSON: the Markdown table with the issue's goal ratios, and a plot.

``python -m bench.report bench/results/<date>.json`` rewrites ``<date>.md`` and
``<date>.png`` next to it from the stored measurements (no benchmark is run).

Every ratio is taken between medians of the same run. GB/s are 10^9 bytes of payload (the
float32 values; headers excluded) per second of the median.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Goal", "goals", "render_markdown", "summarize", "write_plot", "write_reports"]

MIB = 1 << 20
#: Memory goal of issue 5: what a save or a load into a live module may add over the state.
MEMORY_LIMIT = 16 * MIB

#: Display order and labels of the operations.
OP_LABELS = {
    "save": "save (durable: fsync file + folder)",
    "save_nofsync": "save, no fsync",
    "load": "load (warm cache)",
    "load_cold": "load (cold cache)",
    "load_inplace": "load into live moments (warm)",
}
OP_COLORS = {
    "save": "tab:blue",
    "save_nofsync": "tab:orange",
    "load": "tab:green",
    "load_cold": "tab:red",
    "load_inplace": "tab:purple",
}
WORKLOAD_TITLES = {
    "W1": "W1 — 64 float32 tensors (model state, load into a live module)",
    "W2": "W2 — many small float32 tensors (load into a live module)",
    "W3": "W3 — AdamW moments of W1's parameters",
    "W4": "W4 — exact-bits JSON of float32 words",
}
LOAD_NOTES = {
    ("W1", "torch"): "torch.load(weights_only=True) + model.load_state_dict",
    ("W2", "torch"): "torch.load(weights_only=True) + model.load_state_dict",
    ("W1", "safetensors"): "load_file (mmap: bytes are read lazily, in the copy)"
    " + model.load_state_dict",
    ("W2", "safetensors"): "load_file (mmap: bytes are read lazily, in the copy)"
    " + model.load_state_dict",
    ("W3", "torch"): "torch.load(weights_only=True) + opt.load_state_dict",
    ("W3", "raw"): "readinto fresh tensors, then swap them into opt.state",
    ("W4", "json"): "read + json.loads + np.array",
    ("W4", "orjson"): "read + orjson.loads + np.array",
}


def summarize(case: dict) -> dict[str, dict]:
    """Per operation: median/min/max seconds, split medians, worst peak and retained RSS."""
    out = {}
    for op in case.get("ops", []):
        runs = op["runs"]
        calls = op.get("warmup", []) + runs  # memory: the worst call, the first included
        secs = [r["seconds"] for r in runs]
        split_names = sorted({k for r in runs for k in r["splits"]})
        resident = [r["prepare"].get("resident_bytes") for r in runs]
        out[op["op"]] = {
            "median": statistics.median(secs),
            "min": min(secs),
            "max": max(secs),
            "reps": len(secs),
            "splits": {
                k: statistics.median(r["splits"][k] for r in runs if k in r["splits"])
                for k in split_names
            },
            "splits_min": {
                k: min(r["splits"][k] for r in runs if k in r["splits"]) for k in split_names
            },
            "peak_growth": max(r["peak_growth"] for r in calls),
            "retained": max(r["retained"] for r in calls),
            "resident_before": None if None in resident else max(resident),
            "first_call": op["warmup"][0]["seconds"] if op.get("warmup") else None,
        }
    return out


def _index(report: dict) -> dict[tuple[str, str], dict]:
    return {
        (c["workload"], c["library"]): {"case": c, "ops": summarize(c)}
        for c in report["cases"]
        if "error" not in c
    }


# --------------------------------------------------------------------------- formatting


def _secs(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def _mib(b: float) -> str:
    return f"{b / MIB:+.1f}"


def _gbs(nbytes: int, s: float) -> float:
    return nbytes / s / 1e9


def _us_per_tensor(case: dict, s: float) -> float:
    return s / case["tensor_count"] * 1e6


# --------------------------------------------------------------------------- goals


@dataclass(frozen=True)
class Goal:
    """One line of the goal table: ``met`` is None for context rows without a target."""

    text: str
    measured: str
    target: str
    met: bool | None
    #: the same comparison between the fastest repetitions (context on a noisy machine)
    fastest: str = ""

    @property
    def verdict(self) -> str:
        return {True: "**met**", False: "**MISSED**", None: "—"}[self.met]


def _stat(ix: dict, key: tuple, which: str = "median") -> float | None:
    """Median (or ``which="min"``) seconds of ``(workload, library, op[, split])``."""
    workload, library, op, *split = key
    entry = ix.get((workload, library))
    if entry is None or op not in entry["ops"]:
        return None
    stats = entry["ops"][op]
    if split:
        return stats["splits" if which == "median" else "splits_min"].get(split[0])
    return stats[which]


def _median(ix: dict, *key: str) -> float | None:
    return _stat(ix, key)


def _fastest_ratio(ix: dict, num: tuple, den: tuple) -> float | None:
    a, b = _stat(ix, num, "min"), _stat(ix, den, "min")
    return None if a is None or b is None else a / b


def _ratio_goal(ix, text, num, den, limit, *, slower_ok=False) -> Goal | None:
    """``num / den`` (time ratio) against ``limit``: met when ratio ≤ limit (``<`` for 1)."""
    a, b = _median(ix, *num), _median(ix, *den)
    if a is None or b is None:
        return None
    r = a / b
    measured = f"{r:.2f}x the time ({_secs(a)} vs {_secs(b)})"
    fastest = _fastest_ratio(ix, num, den)
    best = "" if fastest is None else f"{fastest:.2f}x"
    if limit is None:
        return Goal(text, measured, "", None, best)
    met = r <= limit if slower_ok else r < limit
    target = f"≤ {limit}x" if slower_ok else f"< {limit}x (faster)"
    return Goal(text, measured, target, met, best)


def _speedup_goal(ix, text, ours, theirs, at_least) -> Goal | None:
    a, b = _median(ix, *ours), _median(ix, *theirs)
    if a is None or b is None:
        return None
    s = b / a
    target = f"≥ {at_least}x faster" if at_least else ""
    met = None if at_least is None else s >= at_least
    how = f"{s:.2f}x faster" if s >= 1 else f"{1 / s:.2f}x slower"
    fastest = _fastest_ratio(ix, theirs, ours)
    best = "" if fastest is None else f"{fastest:.2f}x faster"
    return Goal(text, f"{how} ({_secs(a)} vs {_secs(b)})", target, met, best)


def _per_tensor_goal(ix, text, key, limit_us) -> Goal | None:
    entry = ix.get(key[:2])
    s = _median(ix, *key)
    if s is None:
        return None
    us = _us_per_tensor(entry["case"], s)
    best = _us_per_tensor(entry["case"], _stat(ix, key, "min"))
    return Goal(
        text, f"{us:.2f} µs/tensor", f"≤ {limit_us} µs", us <= limit_us, f"{best:.2f} µs/tensor"
    )


def _memory_goal(ix, text, key, limit) -> Goal | None:
    entry = ix.get(key[:2])
    if entry is None or key[2] not in entry["ops"]:
        return None
    grow = entry["ops"][key[2]]["peak_growth"]
    others = []
    for lib in ("torch", "safetensors"):
        other = ix.get((key[0], lib))
        if other and key[2] in other["ops"]:
            others.append(f"{lib} {_mib(other['ops'][key[2]]['peak_growth'])}")
    measured = f"{_mib(grow)} MiB" + (f" (vs {', '.join(others)} MiB)" if others else "")
    if limit is None:
        return Goal(text, measured, "", None)
    return Goal(text, measured, f"≤ {limit // MIB} MiB", grow <= limit)


def goals(report: dict) -> list[Goal]:
    """The issue-5 goals, each as a ratio from this run (missing cases are skipped)."""
    ix = _index(report)
    tl = "tlckpt"
    rows = [
        _ratio_goal(
            ix,
            "W1 save vs raw write (both durable)",
            ("W1", tl, "save"),
            ("W1", "raw", "save"),
            1.1,
            slower_ok=True,
        ),
        _ratio_goal(
            ix,
            "W1 save vs raw write, neither fsyncs",
            ("W1", tl, "save_nofsync"),
            ("W1", "raw", "save_nofsync"),
            None,
        ),
        _ratio_goal(
            ix, "W1 save vs torch.save (+fsync)", ("W1", tl, "save"), ("W1", "torch", "save"), 1
        ),
        _ratio_goal(
            ix,
            "W1 save vs safetensors save_file (+fsync)",
            ("W1", tl, "save"),
            ("W1", "safetensors", "save"),
            1,
        ),
        _ratio_goal(
            ix,
            "W1 load into module vs raw readinto",
            ("W1", tl, "load"),
            ("W1", "raw", "load"),
            1.1,
            slower_ok=True,
        ),
        _ratio_goal(
            ix,
            "W1 load vs torch.load + load_state_dict",
            ("W1", tl, "load"),
            ("W1", "torch", "load"),
            1,
        ),
        _ratio_goal(
            ix,
            "W1 load vs torch.load alone (no copy)",
            ("W1", tl, "load"),
            ("W1", "torch", "load", "read"),
            None,
        ),
        _ratio_goal(
            ix,
            "W1 load vs safetensors load_file + load_state_dict",
            ("W1", tl, "load"),
            ("W1", "safetensors", "load"),
            1,
        ),
        _ratio_goal(
            ix,
            "W1 load vs safetensors load_file alone (no copy)",
            ("W1", tl, "load"),
            ("W1", "safetensors", "load", "read"),
            None,
        ),
        _ratio_goal(
            ix,
            "W1 cold-cache load vs raw readinto (cold)",
            ("W1", tl, "load_cold"),
            ("W1", "raw", "load_cold"),
            None,
        ),
        _per_tensor_goal(ix, "W2 save", ("W2", tl, "save"), 5),
        _per_tensor_goal(ix, "W2 load", ("W2", tl, "load"), 5),
        _speedup_goal(
            ix, "W2 save vs safetensors", ("W2", tl, "save"), ("W2", "safetensors", "save"), 3
        ),
        _speedup_goal(ix, "W2 save vs torch.save", ("W2", tl, "save"), ("W2", "torch", "save"), 7),
        _speedup_goal(
            ix,
            "W2 load vs safetensors load + load_state_dict",
            ("W2", tl, "load"),
            ("W2", "safetensors", "load"),
            3,
        ),
        _speedup_goal(
            ix,
            "W2 load vs torch.load + load_state_dict",
            ("W2", tl, "load"),
            ("W2", "torch", "load"),
            7,
        ),
        _memory_goal(
            ix,
            "Memory: W1 save, peak RSS growth over the live state",
            ("W1", tl, "save"),
            MEMORY_LIMIT,
        ),
        _memory_goal(
            ix, "Memory: W1 load into module, peak RSS growth", ("W1", tl, "load"), MEMORY_LIMIT
        ),
        _memory_goal(ix, "Memory: W2 save, peak RSS growth", ("W2", tl, "save"), MEMORY_LIMIT),
        _memory_goal(
            ix, "Memory: W2 load into module, peak RSS growth", ("W2", tl, "load"), MEMORY_LIMIT
        ),
        _memory_goal(ix, "Memory: W3 save, peak RSS growth", ("W3", tl, "save"), MEMORY_LIMIT),
        _memory_goal(
            ix,
            "Memory: W3 load (builds the new state off to the side by design)",
            ("W3", tl, "load"),
            None,
        ),
        _ratio_goal(
            ix,
            "W3 save vs raw write (both durable)",
            ("W3", tl, "save"),
            ("W3", "raw", "save"),
            1.2,
            slower_ok=True,
        ),
        _ratio_goal(
            ix,
            "W3 load vs raw readinto into fresh tensors",
            ("W3", tl, "load"),
            ("W3", "raw", "load"),
            1.2,
            slower_ok=True,
        ),
        _ratio_goal(
            ix,
            "W3 load vs raw readinto into the live moments",
            ("W3", tl, "load"),
            ("W3", "raw", "load_inplace"),
            None,
        ),
        _ratio_goal(
            ix,
            "W3 save vs torch.save(opt.state_dict()) (+fsync)",
            ("W3", tl, "save"),
            ("W3", "torch", "save"),
            None,
        ),
        _ratio_goal(
            ix,
            "W3 load vs torch.load + opt.load_state_dict",
            ("W3", tl, "load"),
            ("W3", "torch", "load"),
            None,
        ),
        _speedup_goal(
            ix,
            "W4 encode (array → durable file) vs stdlib json",
            ("W4", tl, "save"),
            ("W4", "json", "save"),
            3,
        ),
        _speedup_goal(
            ix,
            "W4 decode (file → array, validated) vs stdlib json",
            ("W4", tl, "load"),
            ("W4", "json", "load"),
            3,
        ),
        _speedup_goal(
            ix,
            "W4 encode vs stdlib json.dumps call alone",
            ("W4", tl, "save"),
            ("W4", "json", "save", "dumps"),
            None,
        ),
        _speedup_goal(
            ix,
            "W4 decode vs stdlib json.loads call alone",
            ("W4", tl, "load"),
            ("W4", "json", "load", "loads"),
            None,
        ),
        _speedup_goal(
            ix,
            "W4 encode vs orjson (numpy option)",
            ("W4", tl, "save"),
            ("W4", "orjson", "save"),
            None,
        ),
        _speedup_goal(
            ix, "W4 decode vs orjson", ("W4", tl, "load"), ("W4", "orjson", "load"), None
        ),
    ]
    return [g for g in rows if g is not None]


# --------------------------------------------------------------------------- markdown


def _rate(workload: str, case: dict, s: float) -> str:
    if workload == "W2":
        return f"{_us_per_tensor(case, s):.2f} µs/tensor"
    return f"{_gbs(case['payload_bytes'], s):.2f} GB/s"


def _notes(workload: str, library: str, op: str, stats: dict) -> str:
    notes = []
    if op.startswith("load") and op != "load_inplace" and (workload, library) in LOAD_NOTES:
        notes.append(LOAD_NOTES[(workload, library)])
    for name, s in stats["splits"].items():
        label = {"read": "load alone", "dumps": "dumps alone", "loads": "loads alone"}[name]
        notes.append(f"{label} {_secs(s)}")
    if stats["resident_before"] is not None:
        notes.append(f"resident before: {stats['resident_before'] / MIB:.0f} MiB")
    return "; ".join(notes)


def _results_table(report: dict, workload: str) -> list[str]:
    cases = [c for c in report["cases"] if c.get("workload") == workload and "error" not in c]
    if not cases:
        return []
    first = cases[0]
    size = first["payload_bytes"]
    lines = [
        f"### {WORKLOAD_TITLES[workload]}",
        "",
        f"{first['tensor_count']:,} tensor{'s' if first['tensor_count'] != 1 else ''},"
        f" {size / MIB:.1f} MiB of payload ({size / 1e9:.3f} GB); repetitions per"
        f" operation: {len(first['ops'][0]['runs'])}.",
        "",
        "| library | operation | median | min - max | rate (median) | first call (untimed"
        " warm-up) | peak RSS +MiB | retained MiB | file MiB | notes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for case in cases:
        stats_by_op = summarize(case)
        for op in OP_LABELS:
            if op not in stats_by_op:
                continue
            st = stats_by_op[op]
            lines.append(
                f"| {case['library']}{'' if case['verified'] else ' (NOT VERIFIED)'}"
                f" | {OP_LABELS[op]} | {_secs(st['median'])}"
                f" | {_secs(st['min'])} - {_secs(st['max'])}"
                f" | {_rate(workload, case, st['median'])}"
                f" | {'-' if st['first_call'] is None else _secs(st['first_call'])}"
                f" | {_mib(st['peak_growth'])} | {_mib(st['retained'])}"
                f" | {case['file_bytes'] / MIB:.1f}"
                f" | {_notes(workload, case['library'], op, st)} |"
            )
    lines.append("")
    return lines


def render_markdown(report: dict, png_name: str) -> str:
    """The whole report as Markdown."""
    meta = report["meta"]
    m = meta["machine"]
    v = m["versions"]
    sizes = meta["sizes"]
    errors = [c for c in report["cases"] if "error" in c]
    unverified = [c["case"] for c in report["cases"] if "error" not in c and not c["verified"]]
    resettable = all(c.get("peak_resettable", False) for c in report["cases"] if "error" not in c)
    out = [
        f"# tlckpt benchmark — {meta['started'][:10]} ({meta['mode']})",
        "",
        f"* Command: `{meta['command']}` (from the repository root, with `.venv/bin/python`);"
        f" wall time {meta['wall_s']:.0f} s.",
        f"* Machine: {m['cpu']}, {m['cpus']} CPUs, {(m['mem_bytes'] or 0) / 2**30:.0f} GiB RAM;"
        f" scratch on {m['tmp_filesystem']}; {m['platform']}.",
        f"* Python {m['python']}, torch {v['torch']} ({v['torch_threads']} threads),"
        f" numpy {v['numpy']}, safetensors {v['safetensors']}, orjson {v['orjson']};"
        f" tlckpt at {(m['git_commit'] or 'unknown')[:12]}"
        f"{' + uncommitted changes' if m['git_dirty'] else ''}.",
        f"* Load average before / after: {', '.join(f'{x:.2f}' for x in meta['loadavg_before'])}"
        f" / {', '.join(f'{x:.2f}' for x in meta['loadavg_after'])} — a shared, noisy machine:"
        " compare ratios within this run, not absolute numbers across runs.",
        f"* Sizes: W1 {sizes['w1_count']} x {sizes['w1_shape']}; W2 {sizes['w2_count']} x"
        f" {sizes['w2_shape']}; W3 = AdamW moments of W1; W4 {sizes['w4_shape']} words.",
        "",
        "Method: every case (library x workload) runs in its own process; imports are timed"
        " separately and excluded. Each operation is called once untimed (its first-call time"
        " is shown) and then timed several times (median, min - max); before each timed"
        " repetition the worker calls `os.sync()` so no dirty page, ours or another"
        " process's, is written back during the timing."
        " Before every save the target file is removed (untimed). Durable saves fsync the file"
        " and its folder — tlckpt does so itself (and renames a temporary atomically), the"
        ' baselines get the same fsyncs in the timed section. "No fsync" saves: tlckpt'
        " through its file-object form, the others without the fsync calls. Loads run from a"
        " **warm page cache** (the file was just written); cold-cache loads first drop the"
        ' file with `posix_fadvise(POSIX_FADV_DONTNEED)` ("resident before" shows what'
        " stayed cached). Loads into a live module: tlckpt in place; torch and safetensors"
        " load a dict then `load_state_dict` (the time of the load alone is in the notes);"
        " raw `readinto`s the live tensors' memory. Peak RSS growth = VmHWM (reset through"
        " `/proc/self/clear_refs` before each repetition"
        f"{'' if resettable else ', NOT resettable here: lifetime peak, an upper bound'})"
        " minus VmRSS just before the operation, worst call (the untimed first one included);"
        " retained = VmRSS after"
        " minus before. W1-W3 workers run with `MALLOC_MMAP_THRESHOLD_=1 MiB` so freed tensors"
        " return to the OS and every repetition starts from the same baseline; W4 (no memory"
        " goal) runs with the default allocator, as users have it."
        " GB/s = 10^9 payload bytes per second. After the timings each case zeroes its live"
        ' state, loads once more and checks the values ("NOT VERIFIED" flags a failure).',
        "",
    ]
    if errors or unverified:
        out += ["**Problems in this run:**", ""]
        out += [f"* {c['case']}: {c['error']}" for c in errors]
        out += [
            f"* {name}: the verification load did not reproduce the values" for name in unverified
        ]
        out.append("")
    gl = goals(report)
    missed = [g for g in gl if g.met is False]
    out += [
        "## Goals (issue 5), as ratios of medians from this run",
        "",
        f"{sum(g.met is True for g in gl)} met, {len(missed)} missed"
        " (rows without a target are context). Verdicts compare medians; the last column"
        " makes the same comparison between the fastest repetitions of each side, which on"
        " a busy machine shows what the code can do when it is not interrupted.",
        "",
        "| goal | measured (medians) | target | verdict | fastest vs fastest |",
        "|---|---|---|---|---|",
    ]
    out += [f"| {g.text} | {g.measured} | {g.target} | {g.verdict} | {g.fastest} |" for g in gl]
    out += ["", "## Results", ""]
    for workload in WORKLOAD_TITLES:
        out += _results_table(report, workload)
    out += [
        "## Import and setup times (excluded from every timing above)",
        "",
        "| case | numpy | torch | library (on top) | building the live state | process |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in report["cases"]:
        if "error" in c:
            continue
        imp = c["imports"]
        lib = "; ".join(f"{k} {_secs(s)}" for k, s in imp.items() if k not in ("numpy", "torch"))
        out.append(
            f"| {c['case']} | {_secs(imp['numpy'])} | {_secs(imp['torch'])} | {lib or '—'}"
            f" | {_secs(c['setup_s'])} | {_secs(c['process_wall_s'])} |"
        )
    out += ["", f"![throughput per case]({png_name})", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- plot


def write_plot(report: dict, png_path: Path) -> None:
    """Throughput (GB/s) of W1, W3, W4 and µs per tensor of W2, with min-max whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 9.5))
    panels = [("W1", axes[0][0]), ("W3", axes[0][1]), ("W2", axes[1][0]), ("W4", axes[1][1])]
    for workload, ax in panels:
        cases = [c for c in report["cases"] if c.get("workload") == workload and "error" not in c]
        if not cases:
            ax.set_visible(False)
            continue
        summaries = [summarize(c) for c in cases]
        ops = [op for op in OP_LABELS if any(op in s for s in summaries)]
        width = 0.8 / max(len(ops), 1)
        per_tensor = workload == "W2"
        for k, op in enumerate(ops):
            xs, ys, lo, hi = [], [], [], []
            for i, (case, s) in enumerate(zip(cases, summaries)):
                if op not in s:
                    continue
                st = s[op]

                def rate(t, case=case, per_tensor=per_tensor):
                    if per_tensor:
                        return _us_per_tensor(case, t)
                    return _gbs(case["payload_bytes"], t)

                y = rate(st["median"])
                a, b = sorted((rate(st["min"]), rate(st["max"])))
                xs.append(i + (k - (len(ops) - 1) / 2) * width)
                ys.append(y)
                lo.append(y - a)
                hi.append(b - y)
            bars = ax.bar(
                xs, ys, width, yerr=[lo, hi], capsize=3, label=OP_LABELS[op], color=OP_COLORS[op]
            )
            ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
        ax.set_xticks(range(len(cases)), [c["library"] for c in cases])
        ax.set_title(WORKLOAD_TITLES[workload], fontsize=10)
        if per_tensor:
            ax.set_ylabel("µs per tensor (lower is better)")
            ax.set_yscale("log")
        else:
            ax.set_ylabel("GB/s of float32 payload (higher is better)")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    meta = report["meta"]
    fig.suptitle(
        f"tlckpt benchmark {meta['started'][:10]} ({meta['mode']}); medians, whiskers min-max;"
        " loads from warm page cache unless marked cold",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
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
