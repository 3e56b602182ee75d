"""The peers' rows in benchmarks/tables.py's tables and chart, and their own small tables.

Everything here reads the results' JSON (`result["peers"]`, as run.bench_peers returns it):
no server, no TensorFlow.
"""

from __future__ import annotations

from benchmarks.floor import SHARE_ALIGN, SHARE_HEADER, share_cells

# The peers' rows follow this service's (2)-(5) in the table: (6), (7), ...
FIRST_NUMBER = 6
# The load the targets compare at: c=64, one image per request.
TARGET_LOAD = "c64x1"


def labels(peers: dict) -> dict[str, str]:
    """key -> "(6) MLServer 1.6.1, adaptive batching ...", numbered in run order."""
    return {key: f"({FIRST_NUMBER + i}) {p['title']}" for i, (key, p) in enumerate(peers.items())}


def short_labels(peers: dict) -> dict[str, str]:
    """key -> a legend-sized label: "(6) MLServer", "(7) MLServer + tricks"."""
    out = {}
    for i, (key, row) in enumerate(peers.items()):
        name = row["title"].split(" ")[0]
        out[key] = f"({FIRST_NUMBER + i}) {name}" + (" + tricks" if row.get("tricks") else "")
    return out


def row(
    label: str, load: str, r: dict, ceiling: dict | None = None, floor: dict | None = None
) -> str:
    """One peer's row at one load, ending with its share of the model's ceiling, of the
    service's HTTP floor (benchmarks/floor.py) and its processes' CPU per request."""
    c, n = load[1:].split("x")
    return (
        f"| c={c}, {n} img/req | {label} | {r['requests_per_s']:,.0f} | "
        f"{r['images_per_s']:,.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} |"
        + share_cells(r, ceiling, floor, load)
    )


def rows_for_load(
    peers: dict, load: str, ceiling: dict | None = None, floor: dict | None = None
) -> list[str]:
    """The peers' rows of the main table at one load (those that ran it)."""
    names = labels(peers)
    return [
        row(names[key], load, p["loads"][load], ceiling, floor)
        for key, p in peers.items()
        if load in p["loads"]
    ]


def versus_table(
    service: dict, peers: dict, load: str = TARGET_LOAD, heading: str | None = None
) -> str:
    """(4) against each peer at one load: throughput ratio and p99 ratio.

    The issue's target: at least 3x each peer's throughput with a p99 no more than a quarter
    of theirs, at c=64 with one image per request (`heading` says otherwise for another
    model's rows).
    """
    if load not in service:
        return ""
    ours = service[load]
    c, n = load[1:].split("x")
    out = [
        heading
        or f"(4) against the peers at c={c}, {n} img/req "
        "(target: at least 3x their throughput, p99 at most 1/4 of theirs):",
        "",
        "| peer | peer req/s | (4) / peer throughput | (4) p99 / peer p99 |",
        "|---|---:|---:|---:|",
    ]
    names = labels(peers)
    for key, p in peers.items():
        if load not in p["loads"]:
            continue
        theirs = p["loads"][load]
        speedup = (
            ours["requests_per_s"] / theirs["requests_per_s"]
            if theirs["requests_per_s"]
            else float("inf")
        )
        p99 = ours["p99_ms"] / theirs["p99_ms"] if theirs["p99_ms"] else float("inf")
        out.append(
            f"| {names[key]} | {theirs['requests_per_s']:,.0f} | {speedup:.1f}x | {p99:.2f} |"
        )
    return "\n".join(out)


def settings_table(peers: dict, heading: str = "Peers (benchmarks/peers/):") -> str:
    """Each peer row's settings, versions and start-up, under the tables."""
    out = [heading, ""]
    names = labels(peers)
    for key, p in peers.items():
        versions = ", ".join(f"{k} {v}" for k, v in sorted(p.get("versions", {}).items()))
        if "error" in p:
            # The JSON keeps the whole message (a log's tail); its last line says what failed.
            last = [line for line in p["error"].splitlines() if line.strip()][-1:] or ["?"]
            out.append(f"- {names[key]}: settings {p['settings']}; FAILED: {last[0][:300]}")
            continue
        out.append(
            f"- {names[key]}: settings {p['settings']}; up in {p['startup_s']:.0f} s; "
            f"answers within {p['max_abs_diff']:.1g} of tf.saved_model.load's; {versions}"
        )
    return "\n".join(out)


def peers_table(peers: dict) -> str:
    """The peers' rows alone (`python -m benchmarks.peers run` and `sweep`)."""
    out = [
        "| load | server | req/s | images/s | p50 ms | p99 ms | errors |" + SHARE_HEADER,
        "|---|---|---:|---:|---:|---:|---:|" + SHARE_ALIGN,
    ]
    loads = dict.fromkeys(load for p in peers.values() for load in p["loads"])
    for load in loads:
        out += rows_for_load(peers, load)
    return "\n".join(out)
