"""ddp_train: a fast, correct DDP WideResNet / CIFAR-100 trainer (the workload ddp-launch starts).

Read train.py top to bottom for the loop; each other module does one job. The recipe is in
data.py (the data path: reading, augmentation, batches) and learner.py (the model, the optimizer,
the learning rate, the EMA, gradient accumulation); the rooms hold the rest: safety/ (what lets a
run stop, hang or lose a node without losing work) and gate/ (the fabric gate before training).
"""
