"""Training past one process, on torch.distributed and Ray.

- ``data_parallel``: ``DataParallelTrainer``, the GRPO trainer with its update split over ``torch.distributed`` ranks
  (gloo on CPU, NCCL on GPU); ``rlvr train RECIPE --nproc N`` launches it through torchrun's launcher.
- ``rollout_workers``: ``RayRolloutEngine``, a rollout engine whose requests are spread over Ray actors, each holding
  its own engine (``hf`` on CPU, ``vllm`` on GPU); weights reach them after every update.

Neither changes what a one-process run computes: the trainer, the stages and the method components are the same
objects, and the regression runs (``agents.grpo.regression``) never go through this package.
"""
