"""The kinds of batchable work an executor runs: predictions, and the hooked kinds (activations,
gradients, saliency). Each runner says which requests may share a batch and how a batch runs."""
