"""Data for the tests, the CLI's defaults and the bench: deterministic synthetic datasets for every Ultralytics task
(:mod:`.synthetic`) of the aerial scenes :mod:`.aerial` paints, the dense (:mod:`.dense`) and small-object
(:mod:`.small_objects`) sets, the cache they are generated into (:mod:`.cache`), and the tiler that cuts a dataset's
images into overlapping tiles (:mod:`.tiles`)."""
