"""The fabric gate: all-reduces before training that find a bad node or link, so a job does not
spend its hours on one (`python -m ddp_train.gate`, run by the job scripts through ddp-launch).

- run: the command line and the collectives on the ranks (torch).
- judge: the arithmetic and the verdict, without torch (ddp-bench reads gate.json with it).

Nothing here is imported by this file, so `ddp_train.gate.judge` loads without torch.
"""
