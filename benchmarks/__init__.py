"""yolo-ckpt's benchmarks, installed as ``yolo_ckpt.bench`` (the repository's ``benchmarks/``): the matrix runner
behind ``yolo-ckpt bench`` (:mod:`.matrix`), a matrix's cells (:mod:`.cells`) and their two kinds (:mod:`.step_cell`,
:mod:`.train_cell`), the delta tables and plots of a matrix (:mod:`.tables`, :mod:`.plots`), the soak test and the
memory model benchmark. The shipped matrices are the repository's ``cfg/bench/`` (installed as package data,
:mod:`yolo_ckpt.shipped`); results live in ``benchmarks/results``."""
