"""Data for the tests, the CLI's defaults and the bench: deterministic synthetic datasets for every Ultralytics task
(:mod:`.synthetic`) and the tiler that cuts a dataset's images into overlapping tiles (:mod:`.tiles`)."""
