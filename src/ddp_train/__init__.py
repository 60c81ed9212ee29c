"""ddp_train: a fast, correct DDP WideResNet / CIFAR-100 trainer (the workload ddp-launch starts).

Read train.py top to bottom for the loop; each other module does one job.
"""
