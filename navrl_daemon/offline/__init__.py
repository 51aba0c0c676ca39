"""Offline training, above the training core (which never imports it):

- `wiring`: the offline objectives ("bc", "ppo+bc") that `navrl-daemon run` hands to the
  daemon (pipeline/context.py: OfflineObjectives);
- `prefetcher`, `trainer`: the HDF5 prefetcher and offline trainer stages, and the BC term
  of "ppo+bc" with the trainer that feeds it;
- `datasets`, `prefetch`, `prefetch_worker`, `dataset_synth`: the multimodal HDF5 files,
  their prefetch worker processes, and synthetic datasets for tests and benchmarks;
- `bc`: the image+joint policy and its behaviour-cloning learner.
"""
