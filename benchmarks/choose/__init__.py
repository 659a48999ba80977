"""The optimiser suite of `benchmarks/choose.py`: workloads, optimisers, protocol, report."""
