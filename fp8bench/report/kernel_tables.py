"""The Markdown tables of the files `scripts/recipe_bench.py` writes (the blockwise recipe's GEMM rounds, casts,
weight-gradient GEMMs and host cost per call), as docs/kernels.md shows them, and the summaries the script
records per cell: a device-only side's median and spread, whether the host paced a cast's eager loop. Plain
Python over the recorded values: no torch, no GPU."""

from __future__ import annotations

import statistics

HOST_PACED = 0.98
"""A timing loop whose host took at least this share of the GPU's time per iteration kept the GPU waiting (its
cell is marked `host_paced`): when the host is the slower, the two spans are equal (the GPU finishes right after
the host's last enqueue). When the GPU is the slower, the host blocks once CUDA's launch queue is full and
finishes a queue's worth of iterations before the GPU, so over a loop of about a thousand iterations its time
reads well under the GPU's; a figure between that and this one means the host paced part of the loop. The mark
is the loop's, on that host."""


def _measured(rounds_ms: list) -> list[float]:
    return [t for t in rounds_ms if t is not None]


def device_only_summary(rounds_ms: list, flops: float) -> dict:
    """One side's device-only rounds (None where the host could not get ahead): the median and spread over
    the measured rounds, None where none was, and how many were not."""
    done = _measured(rounds_ms)
    med = statistics.median(done) if done else None
    return {"device_only_rounds_ms": rounds_ms, "device_only_rounds_not_measured": len(rounds_ms) - len(done),
            "device_only_median_tflops": flops / med / 1e9 if med else None,
            "device_only_median_over_best": med / min(done) if med else None}


def device_only_table(rows: list[dict], shapes: list[tuple], kernels: list[str]) -> list[str]:
    """The casts timed device-only (the host ahead of the GPU): a table and its 80% count."""
    cell = {(r["kernel"], tuple(r["shape"])): r for r in rows}

    def text(r: dict) -> str:
        if r["device_only_gbps"] is None:
            return "host not ahead"
        if r["device_only_pct_of_same_bytes_copy"] is None:
            return f"{r['device_only_gbps']:.0f} GB/s, copy not measured"
        return f"{r['device_only_gbps']:.0f} GB/s, {r['device_only_pct_of_same_bytes_copy']:.0f}%"

    out = ["", "| cast, device-only (GB/s, % of a same-bytes copy timed so) | " + " | ".join(
        f"{m}×{k}" for m, k in shapes) + " |", "|---" * (len(shapes) + 1) + "|"]
    out += [f"| {kern} | " + " | ".join(text(cell[kern, s]) for s in shapes) + " |" for kern in kernels]
    measured = [r for r in rows if r["device_only_pct_of_same_bytes_copy"] is not None]
    lowest = min(measured, key=lambda r: r["device_only_pct_of_same_bytes_copy"], default=None)
    out += ["", f"Device-only cells at 80% or more of a same-bytes copy timed so: "
            f"{sum(r['device_only_pct_of_same_bytes_copy'] >= 80 for r in measured)} of {len(rows)}"
            + (f"; lowest {lowest['device_only_pct_of_same_bytes_copy']:.1f}% ({lowest['kernel']} at "
               f"{'×'.join(map(str, lowest['shape']))})" if lowest else "")
            + (f"; {len(rows) - len(measured)} without a figure (the host could not get ahead of the cast or "
               f"of its copy)."
               if len(measured) < len(rows) else ".")]
    return out


def markdown(recorded: dict) -> str:
    """The tables docs/kernels.md shows, from a file `scripts/recipe_bench.py` wrote: the GEMM rounds (and
    their device-only rounds), the casts (eager, replayed, device-only), the weight-gradient GEMMs and the host's
    cost per call, whichever parts the file holds."""
    out = []
    if "gemm" in recorded:
        rows = recorded["gemm"]
        out += ["| shape (M×N×K) | ours: median TFLOPS | best | median / best | cuBLAS blockwise: median | "
                "cuBLAS / ours (medians) |", "|---|---|---|---|---|---|"]
        out += [f"| {r['shape']} ({'×'.join(map(str, r['mnk']))}) | {r['ours']['median_tflops']:.0f} | "
                f"{r['ours']['best_tflops']:.0f} | {r['ours']['median_over_best']:.3f} | "
                f"{r['cublas']['median_tflops']:.0f} | {r['ratio_to_cublas']:.3f} |" for r in rows]
        ratios = [r["ratio_to_cublas"] for r in rows]
        out += ["", f"Median ratio over the {len(rows)} shapes {statistics.median(ratios):.3f}, lowest "
                f"{min(ratios):.3f}; widest median / best {max(r['ours']['median_over_best'] for r in rows):.3f}.", ""]
        if "device_only_ratio_to_cublas" in rows[0]:  # files since the rounds were also timed device-only
            out += ["| shape, device-only rounds | ours: median TFLOPS | median / best | cuBLAS blockwise: median | "
                    "median / best | cuBLAS / ours (medians) |", "|---|---|---|---|---|---|"]
            def side(d: dict) -> str:
                if d["device_only_median_tflops"] is None:
                    return "host not ahead | |"
                return f"{d['device_only_median_tflops']:.0f} | {d['device_only_median_over_best']:.3f} |"
            out += [f"| {r['shape']} | {side(r['ours'])} {side(r['cublas'])} "
                    + (f"{r['device_only_ratio_to_cublas']:.3f} |" if r["device_only_ratio_to_cublas"] else "— |")
                    for r in rows]
            measured = [r for r in rows if r["device_only_ratio_to_cublas"]]
            dev = [r["device_only_ratio_to_cublas"] for r in measured]
            if measured:
                out += ["", f"Device-only: median ratio over the {len(measured)} shapes {statistics.median(dev):.3f}, "
                        f"lowest {min(dev):.3f}; widest median / best "
                        f"{max(r['ours']['device_only_median_over_best'] for r in measured):.3f}"
                        + (f"; {len(rows) - len(measured)} shapes not measured (the host could not get ahead)."
                           if len(measured) < len(rows) else "."), ""]
    if "casts" in recorded:
        shapes = list(dict.fromkeys(tuple(r["shape"]) for r in recorded["casts"]))
        kernels = list(dict.fromkeys(r["kernel"] for r in recorded["casts"]))
        cell = {(r["kernel"], tuple(r["shape"])): r for r in recorded["casts"]}
        same = any("same_bytes_copy_gbps" in r for r in recorded["casts"])  # the oldest files: no same-bytes copy
        head = "eager % of copy; of a same-bytes copy; CUDA graph" if same else "eager % of copy; CUDA graph"
        out += [f"| cast ({head}) | " + " | ".join(
            f"{m}×{k} ({m * k * 2 // 2**20} MB)" for m, k in shapes) + " |", "|---" * (len(shapes) + 1) + "|"]
        out += [f"| {kern} | " + " | ".join(
            f"{cell[kern, s]['eager_pct_of_copy']:.0f}%; "
            + (f"{cell[kern, s]['eager_pct_of_same_bytes_copy']:.0f}%; " if same else "")
            + f"{cell[kern, s]['graph_pct_of_copy']:.0f}%" + (" (host-paced)" if cell[kern, s].get("host_paced") else "")
            for s in shapes) + " |" for kern in kernels]
        out += ["", f"Copy bandwidth {recorded['copy_gbps']:.0f} GB/s."]
        if same:
            rows = recorded["casts"]
            of_copy, of_same = (sum(r[key] >= 80 for r in rows)
                                for key in ("eager_pct_of_copy", "eager_pct_of_same_bytes_copy"))
            out.append(f"Eager cells at 80% or more: {of_copy} of {len(rows)} of the 2 GB copy's bandwidth, "
                       f"{of_same} of {len(rows)} of a same-bytes copy's.")
            if any("host_paced" in r for r in rows):  # files that record the loop's pace
                paced = [r for r in rows if r["host_paced"]]
                kept = [r for r in rows if not r["host_paced"]]
                out.append(f"Host-paced (the eager loop's host as slow as its GPU, so the eager figure may hold host "
                           f"time): {len(paced)} of {len(rows)} cells. Of the {len(kept)} others, "
                           f"{sum(r['eager_pct_of_same_bytes_copy'] >= 80 for r in kept)} reach 80% of a same-bytes "
                           f"copy; lowest {min((r['eager_pct_of_same_bytes_copy'] for r in kept), default=0):.1f}%.")
        if any("device_only_gbps" in r for r in recorded["casts"]):  # files since this column was added
            out += device_only_table(recorded["casts"], shapes, kernels)
        out.append("")
    if "wgrad" in recorded:
        out += ["| wgrad shape (M×N×K) | Gluon: median TFLOPS | median / best | SQNR dB | Triton: median TFLOPS | "
                "SQNR dB | Triton / Gluon (medians) |", "|---|---|---|---|---|---|---|"]
        for r in recorded["wgrad"]:
            head = f"| {r['shape']} ({'×'.join(map(str, r['mnk']))}) |"
            if "error" in r:
                out.append(head + f" failed: {r['error'][:120]} | | | | | |")
                continue
            g, t = r["gluon"], r["triton"]
            out.append(head + f" {g['median_tflops']:.0f} | {g['median_over_best']:.3f} | {g['sqnr_db']:.1f} | "
                       f"{t['median_tflops']:.0f} | {t['sqnr_db']:.1f} | {r['ratio_to_triton']:.3f} |")
        out.append("")
    if "host" in recorded:
        via = "host_us_per_call_via_triton" in recorded["host"][0]  # older files: one column
        out += ["| call at 256×256 | host µs per call" + (" | through Triton's dispatch |" if via else " |"),
                "|---|---|" + ("---|" if via else "")]
        out += [f"| {r['op']} | {r['host_us_per_call']:.0f} |"
                + (f" {r['host_us_per_call_via_triton']:.0f} |" if via else "") for r in recorded["host"]]
    return "\n".join(out)
