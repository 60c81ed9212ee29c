"""ddp_bench: `ddp-bench`, reports from finished runs: the scaling table from the trainer's
metrics.jsonl files (report.py) and GPU utilisation from the job's sampler CSVs (gpumon.py).

Reads files only, never torch: it runs on a login node or a laptop. cli.py is the command.
"""
