"""The mechanism, on a bare Ultralytics model: the policy (a ``recompute=`` spec resolved to regions: layers, inner
blocks, head branches, the loss; :mod:`.policy`), the patching (class swap pickled as stock, BN guard, recomputation
counters; :mod:`.patching`, :mod:`.engine`) and the loss regions (:mod:`.losses`, the chunked assigner
:mod:`.assigner`)."""
