"""`make bench`'s tables, targets and chart, from the results' JSON (benchmarks/bench.py's
`result`, as latest.json holds it): no server, no TensorFlow. docs/figures.py renders the
figures page with `table`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks import floor as http_floor
from benchmarks import generic

PROTOCOL_CONCURRENCY = 64
OVERLOAD_CONCURRENCY = 512
# Each server's row label; (5) is (4) as two processes, one per core (service/workers.py).
SERVER_NAMES = {
    "naive": "(2) naive FastAPI",
    "unbatched": "(3) service, batching off",
    "batched": "(4) service, batching on",
    "workers": "(5) service, WORKERS=2",
}


def table(result: dict) -> str:
    from benchmarks.peers import report as peer_report

    ceiling = result["ceiling"]
    peers = result.get("peers") or {}
    floor = result.get("floor") or {}
    one_process = http_floor.floor_rows(result)
    rows = [
        f"Ceiling (1): SavedModel in-process, best batch {ceiling['best_batch']}: "
        f"{ceiling['images_per_s']:,.0f} images/s; batch 1: p50 {ceiling['batch1_p50_ms']:.2f} ms",
    ]
    if floor:
        rows.append(
            f"HTTP floor (F): the service's server ({floor.get('server') or '?'}) and process "
            "layout answering a trivial JSON endpoint, no model (benchmarks/floor.py); share of "
            "floor: req/s over the floor's at the same concurrency ((5) against (F2)); CPU: "
            "the server's processes, per request"
        )
    rows += [
        "",
        "| load | server | req/s | images/s | p50 ms | p99 ms | errors |" + http_floor.SHARE_HEADER,
        "|---|---|---:|---:|---:|---:|---:|" + http_floor.SHARE_ALIGN,
    ]
    for load in result["servers"]["batched"]:
        c, n = load[1:].split("x")
        for layout, label in http_floor.FLOOR_NAMES.items():
            r = (floor.get(layout) or {}).get(load)
            if r is not None:
                rows.append(
                    f"| c={c}, {n} img/req | {label} | {r['requests_per_s']:,.0f} | - | "
                    f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} |"
                    + http_floor.share_cells({**r, "images_per_s": None}, None, None, load)
                )
        for key, label in SERVER_NAMES.items():
            if key not in result["servers"]:
                continue
            r = result["servers"][key][load]
            rows.append(
                f"| c={c}, {n} img/req | {label} | {r['requests_per_s']:,.0f} | "
                f"{r['images_per_s']:,.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                f"{r['errors']} |"
                + http_floor.share_cells(r, ceiling, http_floor.floor_rows(result, key), load)
            )
        rows += peer_report.rows_for_load(peers, load, ceiling, one_process)
    rows += ["", "| load | (3)/(1) | (4)/(1) | (5)/(1) | (4)/(2) |", "|---|---:|---:|---:|---:|"]
    for load, ratio in result["ratios"].items():
        workers = ratio.get("workers_vs_ceiling")
        rows.append(
            f"| {load} | {ratio['unbatched_vs_ceiling']:.2f} | "
            f"{ratio['batched_vs_ceiling']:.2f} | "
            f"{'-' if workers is None else f'{workers:.2f}'} | {ratio['batched_vs_naive']:.1f}x |"
        )
    c1 = result["servers"]["batched"]["c1x1"]["p50_ms"]
    rows.append("")
    base = ceiling["batch1_p50_ms"]
    rows.append(
        f"At c=1, (4) p50 {c1:.2f} ms vs (1) batch-1 p50 {base:.2f} ms: +{c1 - base:.2f} ms"
    )
    for server in ("batched", "workers"):
        protocols, overload = extras(result, server)
        if protocols:
            rows += ["", protocols_table(protocols, SERVER_NAMES[server], ceiling,
                                         http_floor.floor_rows(result, server))]  # fmt: skip
        if overload:
            c64 = result["servers"][server]["c64x1"]
            rows += ["", overload_table(overload, c64, SERVER_NAMES[server])]
    memory = result.get("memory")
    if memory:
        rows += [
            "",
            f"Memory (VmRSS after the same short load): one version "
            f"{memory['one_version_mb']:,.0f} MB, two versions {memory['two_versions_mb']:,.0f} "
            f"MB: the second adds {memory['second_version_mb']:,.0f} MB (its weights: "
            f"{memory['weights_mb']:.1f} MB on disk).",
        ]
    if peers:
        rows += ["", peer_report.versus_table(result["servers"]["batched"], peers)]
        rows += ["", peer_report.settings_table(peers)]
    if result.get("tensorflow_2_15"):
        rows += ["", tensorflow_table(result)]
    if result.get("generic"):
        rows += ["", generic.generic_table(result)]
    if result.get("targets"):
        rows += ["", targets_table(result["targets"])]
    return "\n".join(rows)


def extras(result: dict, server: str) -> tuple[dict, dict]:
    """A server's rows by protocol and its overload row ((4)'s keep their original keys)."""
    if server == "batched":
        return result.get("protocols") or {}, result.get("overload") or {}
    return (result.get(f"protocols_{server}") or {}), (result.get(f"overload_{server}") or {})


def targets(result: dict, server: str = "batched") -> list[dict]:
    """The throughput, overload and memory targets, each as measured in this run by `server`
    ((4), the defaults, is the one compared with the peers and measured for memory)."""
    ceiling = result["ceiling"]["images_per_s"]
    c64 = result["servers"][server]["c64x1"]
    c1 = result["servers"][server]["c1x1"]["p50_ms"] - result["ceiling"]["batch1_p50_ms"]
    protocols, overload = extras(result, server)
    out = [
        {"what": ":predict c=64, JSON: share of the ceiling", "target": ">= 0.5",
         "measured": c64["images_per_s"] / ceiling,
         "met": c64["images_per_s"] / ceiling >= 0.5 and c64["errors"] == 0},
        {"what": ":predict c=64: p99 ms", "target": "< 50",
         "measured": c64["p99_ms"], "met": c64["p99_ms"] < 50 and c64["errors"] == 0},
        {"what": "c=1: ms over the model's batch-1 p50", "target": "<= 0.5",
         "measured": c1, "met": c1 <= 0.5},
    ]  # fmt: skip
    if "friendly_json" in protocols:
        # Against :predict measured right beside it, when it was.
        beside = protocols.get("v1_json", c64)
        friendly = protocols["friendly_json"]
        share = friendly["requests_per_s"] / beside["requests_per_s"]
        out.append(
            {"what": "/predict JSON pixels c=64: share of :predict", "target": ">= 0.8",
             "measured": share, "met": share >= 0.8 and friendly["errors"] == 0}
        )  # fmt: skip
    for key, name in (("v2_binary", "V2 binary"), ("grpc", "gRPC Predict")):
        if key in protocols:
            share = protocols[key]["requests_per_s"] / ceiling
            out.append(
                {"what": f"{name} c=64: share of the ceiling", "target": ">= 0.6",
                 "measured": share, "met": share >= 0.6 and protocols[key]["errors"] == 0}
            )  # fmt: skip
    if overload:
        share = overload["ok_per_s"] / c64["requests_per_s"]
        good_p99 = overload["probes"]["ok"]["p99_ms"]
        refused_p99 = overload["probes"]["refused"]["p99_ms"]
        clean = (
            overload["refused_without_retry_after"] == 0
            and overload["other_answers"] == 0
            and overload["socket_errors"] == 0
        )
        out += [
            {"what": f"c={overload['concurrency']}: good answers/s, share of c=64",
             "target": ">= 0.8", "measured": share, "met": share >= 0.8},
            {"what": f"c={overload['concurrency']}: p99 ms of the good answers (probes)",
             "target": "< 200", "measured": good_p99,
             "met": good_p99 is not None and good_p99 < 200},
            {"what": f"c={overload['concurrency']}: p99 ms of the 503s (probes), all with "
             "Retry-After, nothing else", "target": "fast", "measured": refused_p99,
             "met": clean and (refused_p99 is None or refused_p99 < good_p99)},
        ]  # fmt: skip
    if server != "batched":
        prefix = SERVER_NAMES[server].split(",")[-1].strip()
        return [{**row, "what": f"{prefix}: {row['what']}"} for row in out]
    memory = result.get("memory")
    if memory:
        out.append(
            {"what": "memory: MB a second loaded version adds (MB of weights)",
             "target": "<< one version's RSS", "measured": memory["second_version_mb"],
             "met": memory["second_version_mb"] < memory["one_version_mb"] / 2}
        )  # fmt: skip
    for peer in (result.get("peers") or {}).values():
        theirs = peer.get("loads", {}).get("c64x1")
        if not theirs:
            continue
        speedup = c64["requests_per_s"] / max(theirs["requests_per_s"], 1e-9)
        p99 = c64["p99_ms"] / max(theirs["p99_ms"], 1e-9)
        out.append(
            {"what": f"vs {peer['title']}: throughput x, p99 share", "target": ">= 3x, <= 0.25",
             "measured": [speedup, p99], "met": speedup >= 3 and p99 <= 0.25}
        )  # fmt: skip
    return out + tabular_targets(result)


def tabular_targets(result: dict) -> list[dict]:
    """The tabular classifier at c=64, one row a request (benchmarks/generic.py): its share of
    the one-process HTTP floor, and its throughput against each peer on the same model."""
    tabular = (result.get("generic") or {}).get("tabular") or {}
    ours = (tabular.get("loads") or {}).get("c64x1")
    if ours is None:
        return []
    out = []
    floor = (http_floor.floor_rows(result) or {}).get("c64x1")
    if floor is not None:
        share = ours["requests_per_s"] / floor["requests_per_s"]
        out.append(
            {"what": "tabular classifier c=64, 1 row/req: share of the HTTP floor",
             "target": ">= 0.5", "measured": share, "met": share >= 0.5 and ours["errors"] == 0}
        )  # fmt: skip
    for peer in (tabular.get("peers") or {}).values():
        theirs = (peer.get("loads") or {}).get("c64x1")
        if not theirs:
            continue
        speedup = ours["requests_per_s"] / max(theirs["requests_per_s"], 1e-9)
        out.append(
            {"what": f"tabular classifier vs {peer['title']}: throughput x", "target": ">= 3x",
             "measured": speedup, "met": speedup >= 3 and ours["errors"] == 0}
        )  # fmt: skip
    return out


def targets_table(rows: list[dict]) -> str:
    def shown(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, list):
            return ", ".join(shown(v) for v in value)
        return f"{value:.2f}" if abs(value) < 10 else f"{value:,.0f}"

    out = ["Targets (throughput, overload, memory, peers), as measured in this run:", "",
           "| what | target | measured | met |", "|---|---|---:|---|"]  # fmt: skip
    for row in rows:
        met = "yes" if row["met"] else "**no**"
        out.append(f"| {row['what']} | {row['target']} | {shown(row['measured'])} | {met} |")
    return "\n".join(out)


def overload_table(overload: dict, c64: dict, server: str = "(4) service, batching on") -> str:
    probes = overload["probes"]

    def ms(value) -> str:
        return "-" if value is None else f"{value:.1f}"

    return "\n".join(
        [
            f"{server}, overloaded: wrk c={overload['concurrency']} on :predict for "
            f"{overload['seconds']:.0f} s, 1 img/req; latency by status from "
            f"{probes['clients']} probe clients in the same flood:",
            "",
            "| good/s | share of c=64 | 503/s | 503 without Retry-After | other answers | "
            "good p50 / p99 ms | 503 p50 / p99 ms |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {overload['ok_per_s']:,.0f} | {overload['ok_per_s'] / c64['requests_per_s']:.2f} "
            f"| {overload['refused_per_s']:,.0f} | {overload['refused_without_retry_after']} | "
            f"{overload['other_answers'] + overload['socket_errors']} | "
            f"{ms(probes['ok']['p50_ms'])} / {ms(probes['ok']['p99_ms'])} | "
            f"{ms(probes['refused']['p50_ms'])} / {ms(probes['refused']['p99_ms'])} |",
        ]
    )


def protocols_table(
    protocols: dict,
    server: str = "(4) service, batching on",
    ceiling: dict | None = None,
    floor: dict | None = None,
) -> str:
    names = {
        "v1_json": "TF Serving REST, JSON (wrk)",
        "friendly_json": "friendly /predict, JSON integer pixels (wrk)",
        "v2_binary": "Open Inference Protocol, binary tensors (wrk)",
        "grpc": "TF Serving gRPC Predict (h2load, one connection)",
    }
    rows = [
        f"{server}, by protocol, c={PROTOCOL_CONCURRENCY}, 1 img/req:",
        "",
        "| protocol | req/s | p50 ms | p99 ms | errors |" + http_floor.SHARE_HEADER,
        "|---|---:|---:|---:|---:|" + http_floor.SHARE_ALIGN,
    ]
    load = f"c{PROTOCOL_CONCURRENCY}x1"
    for key, r in protocols.items():
        one_image = {**r, "images_per_s": r["requests_per_s"]}
        rows.append(
            f"| {names[key]} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.1f} | "
            f"{r['p99_ms']:.1f} | {r['errors']} |"
            + http_floor.share_cells(one_image, ceiling, floor, load)
        )
    return "\n".join(rows)


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.peers import report as peer_report

    loads = list(result["servers"]["batched"])
    bars = {SERVER_NAMES[key]: result["servers"][key] for key in SERVER_NAMES
            if key in result["servers"]}  # fmt: skip
    peers = result.get("peers") or {}
    labels = peer_report.short_labels(peers)
    bars.update({labels[key]: peer["loads"] for key, peer in peers.items()})
    x = np.arange(len(loads))
    width = 0.8 / len(bars)
    fig, ax = plt.subplots(figsize=(8 + len(peers), 4.5))
    for i, (name, by_load) in enumerate(bars.items()):
        ax.bar(
            x + (i - (len(bars) - 1) / 2) * width,
            [by_load[load]["images_per_s"] if load in by_load else 0 for load in loads],
            width,
            label=name,
        )
    ax.axhline(result["ceiling"]["images_per_s"], color="k", ls="--", label="in-process ceiling")
    ax.set_xticks(x, [load.replace("x", " x") + " img" for load in loads])
    ax.set_ylabel("images/s")
    ax.set_title(f"Throughput on {result['machine']['cores']} cores ({result['date']})")
    ax.legend(fontsize="small" if peers else None)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def tensorflow_comparison(result: dict) -> dict:
    """Per load, (4)'s images/s and its share of its own ceiling on each TensorFlow."""
    old = result["tensorflow_2_15"]
    return {
        load: {
            "current": row["images_per_s"],
            "current_vs_ceiling": row["images_per_s"] / result["ceiling"]["images_per_s"],
            "tf215": old["batched"][load]["images_per_s"],
            "tf215_vs_ceiling": old["batched"][load]["images_per_s"]
            / old["ceiling"]["images_per_s"],
            "current_vs_tf215": row["images_per_s"] / old["batched"][load]["images_per_s"],
        }
        for load, row in result["servers"]["batched"].items()
    }


def tensorflow_table(result: dict) -> str:
    """The service on both TensorFlows: (1), (4) and (4)/(1) side by side."""
    old = result["tensorflow_2_15"]
    current = result["tensorflow"]
    rows = [
        f"The service on TensorFlow {current} (its own) and {old['tensorflow']} (the trainer's), "
        "the same model, bodies and loads:",
        "",
        f"| load | (4) on {current}, images/s | (4)/(1) | (4) on {old['tensorflow']}, "
        "images/s | (4)/(1) | current / 2.15 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for load, row in tensorflow_comparison(result).items():
        rows.append(
            f"| {load} | {row['current']:,.0f} | {row['current_vs_ceiling']:.2f} | "
            f"{row['tf215']:,.0f} | {row['tf215_vs_ceiling']:.2f} | "
            f"{row['current_vs_tf215']:.2f}x |"
        )
    rows.append(
        f"| (1) ceiling | {result['ceiling']['images_per_s']:,.0f} | | "
        f"{old['ceiling']['images_per_s']:,.0f} | | "
        f"{result['ceiling']['images_per_s'] / old['ceiling']['images_per_s']:.2f}x |"
    )
    return "\n".join(rows)
