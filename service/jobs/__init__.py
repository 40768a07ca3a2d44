"""Data-set jobs: long computations over a whole data set (unit statistics, exemplars), run in chunks as
low-priority hooked batches on a model's executor, persisted so a restarted server resumes them."""
