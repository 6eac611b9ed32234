"""Memory-model accuracy: how close the memory model's estimates come to measured training steps (one step, every
step of an epoch, layouts it was not fitted on, term by term), and how fast it estimates and plans."""
