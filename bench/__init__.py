"""Ferry's benchmark (``python -m bench``); see bench/run.py and README.md "Benchmark"."""
