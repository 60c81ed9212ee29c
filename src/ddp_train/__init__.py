"""ddp_train: a fast, correct DDP WideResNet / CIFAR-100 trainer (the workload ddp-launch starts).

Read train.py top to bottom for the loop, after config.py (the flags) and resolve.py (the run's decisions,
made once); each other module does one job. The rooms: recipe/ (the model, the learner, the data path,
evaluation: what trains), fast/ (the GPU speed code: compile, DDP's setup, the warm-up, the levers, our
kernels), safety/ (what lets a run stop, hang or lose a node without losing work) and gate/ (the fabric
gate before training).
"""
