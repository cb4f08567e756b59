"""Benchmarks behind `txbroker bench ...`: each prints figures, medians of runs, and a baseline
measured in the same run."""
