"""The Ultralytics integration: the trainer mixin, only what must hook Ultralytics (:mod:`.trainer`: keys in,
``setup_model``, ``auto_batch``, the report at the end), and beside it as functions of the trainer its planning
(:mod:`.planning`), the run folder put back after a failed set-up (:mod:`.run_dir`), the run's measurements and report
(:mod:`.run_stats`), what the run plans and measures on one object (:mod:`.state`), the trainer's task
(:mod:`.tasks`), atomic saves (:mod:`.atomic`), torchrun (:mod:`.distributed`), resuming (:mod:`.resume`) and the
early checks of its inputs and data (:mod:`.inputs`, :mod:`.data_check`)."""
