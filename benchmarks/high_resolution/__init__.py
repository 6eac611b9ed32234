"""High resolution: what recomputation saves at large image sizes (the attention region's peaks)."""
