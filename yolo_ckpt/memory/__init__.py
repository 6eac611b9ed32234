"""The memory of a training step: counted (live tensors, the CUDA allocator; :mod:`.tracker`), measured (the one
training-step harness on the task's synthetic batch, per phase and per layer; :mod:`.step`, :mod:`.training_batch`,
:mod:`.layer_accounting`), estimated (a fake step on a fake copy with the loss formula on top, CUDA AMP emulated on
the CPU; :mod:`.estimate`, :mod:`.fake_copy`, :mod:`.amp`), the loss formula and its calibration (:mod:`.loss_model`,
:mod:`.loss_calibration`), composed for any recomputed units (:mod:`.composed`), planned
(:class:`~.planner.MemoryModel`, :class:`~.planner.Plan`; :mod:`.planner`), the Ultralytics rules it mirrors
(:mod:`.ultralytics_rules`), the run assumed (:mod:`.runspec`) and the one builder of a run's memory model
(:mod:`.planned_run`)."""
