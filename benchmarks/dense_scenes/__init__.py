"""Dense scenes: steps with hundreds to thousands of objects per image (the chunked assigner and the recomputed loss
against stock, the densest batch a dataset's mosaic can make, the densest sample a long run draws)."""
