"""Ferry's benchmark (``python -m bench``); see bench/run.py and docs/how-to/run-benchmark.md."""
