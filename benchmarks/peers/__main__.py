"""`python -m benchmarks.peers`: the peers alone, for setting them up and trying settings.

  setup              install the peers' venvs (benchmarks/.peers/), nothing else
  run [--seconds S] [--model DIR] [--tabular]
                     the peers' rows (spec.ROWS) at bench.py's loads; with --tabular, their
                     rows on the tabular classifier (spec.TABULAR_ROWS) at its loads (the
                     newest under models/tabular_classifier, or one trained now); prints,
                     saves nothing
  sweep [--seconds S] [--model DIR] [--all-loads] [--only KEY...]
                     every setting in spec.SWEEP (or those named, from SWEEP or ROWS), at c=64
                     with one image per request unless --all-loads; prints, saves nothing
  versus [--tabular] [--rounds N] [--seconds S] [--no-tricks] [--save] [--checkout DIR]
                     head to head: this service and the peers up at once, loaded in turn
                     at c=64 in interleaved rounds, medians and ratios (versus.py); with
                     --save, into benchmarks/results/versus-<model>-<date>-<time>.json
  lock [PEER...]     re-resolve requirements-PEER.in and rewrite requirements-PEER.lock

The full comparison, with this service's rows in the same run and table, is
`make bench-peers` (python -m benchmarks.bench --peers).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.peers import report, spec, venvs


def measure(variants, seconds: int, loads, model: Path | None = None) -> dict:
    from artifact.quiet import quiet_tensorflow
    from benchmarks import common, generic
    from benchmarks.peers import run

    quiet_tensorflow()
    versions = run.prepare(variants)
    workdir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    try:
        if variants[0].model == spec.TABULAR:
            tabular = next(m for m in generic.MODELS if m.key == "tabular")
            version_path = model or generic.find_or_train(tabular, workdir, common.ROOT / "models")
            bodies = generic.model_bodies("tabular", version_path, workdir, loads)
        else:
            version_path = model or common.find_or_train_model(workdir)
            bodies = common.request_bodies(workdir)
        print(f"Model {version_path}", flush=True)
        return run.bench_peers(
            version_path, bodies, workdir, seconds, loads, variants, versions=versions
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="install the peers' venvs")
    run_parser = sub.add_parser("run", help="the peers' rows alone; saves nothing")
    sweep_parser = sub.add_parser("sweep", help="every setting tried; saves nothing")
    for p in (run_parser, sweep_parser):
        p.add_argument("--seconds", type=int, default=8, help="wrk duration per load")
        p.add_argument(
            "--model",
            type=Path,
            help="an exported version's folder (default: bench.py's: the newest under "
            "models/fashion_mnist, models/tabular_classifier with --tabular, or a small one "
            "trained now)",
        )
    run_parser.add_argument(
        "--tabular", action="store_true", help="the rows on the tabular classifier instead"
    )
    sweep_parser.add_argument("--all-loads", action="store_true", help="bench.py's four loads")
    sweep_parser.add_argument("--only", nargs="*", help="keys of spec.SWEEP or spec.ROWS to run")
    versus_parser = sub.add_parser("versus", help="head to head at c=64, interleaved rounds")
    versus_parser.add_argument("--tabular", action="store_true", help="the tabular classifier")
    versus_parser.add_argument("--rounds", type=int, default=3, help="rounds (at least 1)")
    versus_parser.add_argument("--seconds", type=int, default=8, help="wrk duration per load")
    versus_parser.add_argument("--no-tricks", action="store_true", help="the plain peers only")
    versus_parser.add_argument("--save", action="store_true", help="write the run's JSON")
    versus_parser.add_argument("--checkout", type=Path, action="append", default=[],
                               help="another checkout's service beside this one's")  # fmt: skip
    lock_parser = sub.add_parser("lock", help="rewrite the peers' lock files")
    lock_parser.add_argument(
        "peers", nargs="*", help=f"of {', '.join(venvs.PEERS)}; all by default"
    )
    args = parser.parse_args(argv)
    unknown = set(getattr(args, "only", None) or ()) - set(spec.BY_KEY)
    if unknown:
        parser.error(f"unknown key(s) {sorted(unknown)}: choose from {list(spec.BY_KEY)}")

    if args.command == "versus" and (args.rounds < 1 or args.seconds < 1):
        parser.error(f"--rounds and --seconds: at least 1, got {args.rounds} and {args.seconds}")
    for checkout in getattr(args, "checkout", None) or ():
        if not (checkout / "service" / "__main__.py").is_file():
            parser.error(f"--checkout {checkout}: not a checkout of this project (no service/)")

    if args.command == "setup":
        for peer in venvs.PEERS:
            venvs.ensure(peer)
            print(f"{peer}: {venvs.venv_dir(peer)} {venvs.installed_versions(peer)}")
        return 0
    if args.command == "lock":
        unknown = set(args.peers) - set(venvs.PEERS)
        if unknown:
            parser.error(f"unknown peer(s) {sorted(unknown)}: choose from {list(venvs.PEERS)}")
        for peer in args.peers or venvs.PEERS:
            venvs.relock(peer)
        return 0
    if shutil.which("wrk") is None:
        print("error: wrk is not installed (apt-get install wrk; `make bench` does it)")
        return 2
    if args.command == "versus":
        from benchmarks.peers import versus

        model = spec.TABULAR if args.tabular else spec.MODEL_NAME
        return versus.main(model, args.rounds, args.seconds, not args.no_tricks, args.save,
                           args.checkout)  # fmt: skip
    from benchmarks.common import LOADS

    if args.command == "run" and args.tabular:
        from benchmarks.generic import GENERIC_LOADS

        variants, loads = spec.TABULAR_ROWS, GENERIC_LOADS
    elif args.command == "run":
        variants, loads = spec.ROWS, LOADS
    else:
        variants = [spec.BY_KEY[k] for k in dict.fromkeys(args.only)] if args.only else spec.SWEEP
        loads = LOADS if args.all_loads else [(64, 1)]
    peers = measure(variants, args.seconds, loads, args.model)
    print()
    print(report.peers_table(peers))
    print()
    print(report.settings_table(peers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
