"""MLServer and BentoML serving the same model, as peers in `make bench-peers`.

spec.py: the peers' settings, files, request bodies and answers (pure, fast-tested);
venvs.py: each peer's virtualenv under benchmarks/.peers/, installed from its lock;
run.py: start each peer, check one answer against the model's, load it with wrk;
report.py: the peers' rows in the benchmark's table and chart (benchmarks/tables.py);
mlserver_runtime.py, bentoml_service.py and bentoml_tabular_service.py run inside the
peers' venvs, not here.
`python -m benchmarks.peers --help` lists the commands (setup, run, sweep, lock).
"""
