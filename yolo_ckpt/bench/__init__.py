"""The matrix runner behind ``yolo-ckpt bench`` (:mod:`.matrix`), the matrix file it reads and checks
(:mod:`.matrix_file`), a matrix's cells (:mod:`.cells`) and their two kinds (:mod:`.step_cell`, :mod:`.train_cell`),
the planned cells (:mod:`.planning`), the delta tables and plots of a matrix (:mod:`.tables`, :mod:`.plots`) and the
results folder's provenance (:mod:`.results_io`). The shipped matrices are package data in ``yolo_ckpt/cfg/bench/``
(:mod:`yolo_ckpt.shipped`); the studies that are not shipped and the committed results live in the repository's
``benchmarks/``."""
