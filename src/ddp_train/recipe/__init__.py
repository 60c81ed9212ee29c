"""The recipe: what trains and on what, the same on every device and in every world.

- model: the guide's WideResNet.
- learner: the model and what trains it (SGD, the loss scaler, the loss, the weights' EMA), the learning
  rate at each step, gradient accumulation; its state_dict is what a checkpoint keeps of it.
- data: CIFAR-100 on the device as uint8, each rank's batches gathered and augmented there.
- evaluate: the test set's accuracy over the ranks' shards, with flip test-time augmentation.

Nothing here is imported by this file.
"""
