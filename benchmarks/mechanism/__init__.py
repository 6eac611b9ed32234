"""Mechanism and speed: recomputation is exact (the attention region against stock, bit for bit) and does not leak
(a soak of many epochs)."""
