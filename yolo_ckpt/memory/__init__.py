"""The memory of a training step: measured (live tensors, the CUDA allocator, the one training-step harness;
:mod:`.measure`), estimated (a fake step, the loss model, CUDA AMP emulated on CPU; :mod:`.estimate`, :mod:`.amp`),
planned (:class:`~.plan.MemoryModel`, :class:`~.plan.Plan`; :mod:`.plan`), the run assumed (the Ultralytics rules it
mirrors; :mod:`.runspec`) and the one builder of a run's memory model (:mod:`.planned_run`)."""
