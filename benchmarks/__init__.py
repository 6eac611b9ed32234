"""Studies that are not shipped (run from a checkout: ``python -m benchmarks.soak out=...``): the soak test, the
memory model benchmark, the estimate's accuracy, the densest mosaic and the dense assigner. Their results, and the
matrix runner's (:mod:`yolo_ckpt.bench`), are data in ``benchmarks/results/``."""
