"""yolo-ckpt's benchmarks, installed as ``yolo_ckpt_bench``: the matrix runner behind ``yolo-ckpt bench``
(:mod:`.matrix`), its two kinds of cell (:mod:`.step_cell`, :mod:`.train_cell`), the delta tables and plots of a
matrix (:mod:`.tables`, :mod:`.plots`), and the memory model benchmark. Results live in ``benchmarks/results``."""
