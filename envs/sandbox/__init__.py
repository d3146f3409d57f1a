"""Code-execution sandboxes (temporary init; replaced below)."""
