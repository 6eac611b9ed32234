"""Studies that are not shipped, one sub-package per question the results answer (``results/index.yaml``'s
``questions:``): ``memory_model``, ``dense_scenes``, ``high_resolution``, ``equal_memory``, ``mechanism``; run from a
checkout, e.g. ``python -m benchmarks.mechanism.soak out=...``. :mod:`benchmarks.results_index` is the index of their
results and the matrix runner's (:mod:`yolo_ckpt.bench`), which are data in ``benchmarks/results/``."""
