"""What a run leaves behind: its record (``ckpt_report.json``, :class:`~.record.RunReport`; :mod:`.record`), runs
compared (:mod:`.compare`) and the per-layer picture of a training step (:mod:`.layer_plot`)."""
